"""The committed protoc output must be exactly what the pinned grpcio-tools generates."""

from pathlib import Path

import pytest

from hetrl.protos import generate

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    for fresh in generate.generate(tmp_path):
        committed = ROOT / "protos" / fresh.name
        command = "python -m hetrl.protos.generate"
        assert committed.exists(), f"{committed} is missing: run `{command}`"
        assert fresh.read_bytes() == committed.read_bytes(), (
            f"{committed.name} is stale: run `{command}` and commit the result"
        )


def test_generated_code_targets_protobuf_6() -> None:
    text = (ROOT / "protos" / "hetrl_pb2.py").read_text()
    assert "# Protobuf Python Version: 6." in text
