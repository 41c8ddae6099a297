"""Regenerate `hetrl_pb2.py`, `hetrl_pb2.pyi` and `hetrl_pb2_grpc.py` from `hetrl.proto`.

Run `python -m hetrl.protos.generate` after editing the schema. protoc derives the
generated imports from the proto's path, so the schema is compiled as
`hetrl/protos/hetrl.proto` (the installed package name), whatever the checkout's folder
is called. `generate(out_dir)` writes elsewhere so the drift test can compare without
touching the committed files. Needs grpcio-tools (a dev dependency), never imported at
run time.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED = ("hetrl_pb2.py", "hetrl_pb2.pyi", "hetrl_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on hetrl.proto; return the generated files, written into out_dir."""
    from grpc_tools import protoc  # dev-only dependency

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in" / "hetrl" / "protos" / "hetrl.proto"
        source.parent.mkdir(parents=True)
        shutil.copyfile(HERE / "hetrl.proto", source)
        built = Path(tmp) / "out"
        built.mkdir()
        args = [
            "protoc",
            f"-I{Path(tmp) / 'in'}",
            f"--python_out={built}",
            f"--pyi_out={built}",
            f"--grpc_python_out={built}",
            str(source),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        for name in GENERATED:
            shutil.copyfile(built / "hetrl" / "protos" / name, out_dir / name)
    return [out_dir / name for name in GENERATED]


if __name__ == "__main__":
    files = generate(HERE)
    print("\n".join(str(f) for f in files))
    sys.exit(0)
