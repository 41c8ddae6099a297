"""Regenerate `hetrl_pb2.py`, `hetrl_pb2.pyi` and `hetrl_pb2_grpc.py` from `hetrl.proto`.

Run `python -m protos.generate` from the repository root after editing the schema.
`generate(out_dir)` writes elsewhere so the drift test can compare without touching
the committed files. Needs grpcio-tools (a dev dependency), never imported at run time.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("hetrl_pb2.py", "hetrl_pb2.pyi", "hetrl_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on protos/hetrl.proto; return the generated files under out_dir/protos."""
    from grpc_tools import protoc  # dev-only dependency

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(ROOT / "protos" / "hetrl.proto"),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return [out_dir / "protos" / name for name in GENERATED]


if __name__ == "__main__":
    files = generate(ROOT)
    print("\n".join(str(f.relative_to(ROOT)) for f in files))
    sys.exit(0)
