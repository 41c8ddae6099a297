"""Checkpoints 9 (docs/reliability.md): learner.checkpoint writes atomically, keeps the
newest K, and resume falls back from a corrupt newest checkpoint with a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from hetrl.learner.checkpoint import checkpoints, load_latest, save_checkpoint


def test_corrupt_newest_checkpoint_falls_back_with_a_warning(tmp_path: Path, caplog) -> None:
    for step in (100, 200, 300, 400):
        save_checkpoint(tmp_path, step, {"policy": {"w": torch.full((3,), float(step))},
                                         "global_step": step}, keep=3)
    assert [p.name for p in checkpoints(tmp_path)] == [
        "ckpt-000000000400.pt", "ckpt-000000000300.pt", "ckpt-000000000200.pt"]
    assert not list(tmp_path.glob(".*.tmp"))  # the temp file was renamed, not left
    newest = checkpoints(tmp_path)[0]
    newest.write_bytes(newest.read_bytes()[:50])  # truncated, as by a crash mid-copy
    with caplog.at_level(logging.WARNING, logger="hetrl.checkpoint"):
        path, state = load_latest(tmp_path)
    assert path.name == "ckpt-000000000300.pt" and state["global_step"] == 300
    assert "unreadable" in caplog.text and "ckpt-000000000400" in caplog.text
