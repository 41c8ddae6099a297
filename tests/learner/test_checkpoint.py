"""Checkpoints 9 (docs/reliability.md): learner.checkpoint writes atomically, keeps the
newest K, and resume falls back from a corrupt newest checkpoint with a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from hetrl.learner.checkpoint import (
    checkpoints,
    load_latest,
    load_newest,
    rescue_dir,
    save_checkpoint,
)


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


def test_resume_takes_a_surviving_ranks_rescue_when_it_holds_more_steps(tmp_path: Path) -> None:
    # Rank 0 died: its newest periodic checkpoint is older than what rank 1 rescued.
    def save(directory: Path, step: int) -> None:
        save_checkpoint(directory, step, {"policy": {"w": torch.full((2,), float(step))},
                                          "global_step": step}, keep=3)

    save(tmp_path, 300)
    save(rescue_dir(tmp_path, 1), 420)
    save(rescue_dir(tmp_path, 2), 420)
    path, state = load_newest(tmp_path)
    assert state["global_step"] == 420 and path.parent.name == "rescue-rank1"
    # A later run's own checkpoints pass the old rescue; on a tie rank 0's wins.
    save(tmp_path, 420)
    assert load_newest(tmp_path)[0].parent == tmp_path
    assert load_newest(tmp_path / "none") is None
