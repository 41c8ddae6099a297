"""Learner checkpoints: written atomically, the newest K kept, resumed with a fallback.

A checkpoint is one `torch.save` of plain containers and tensors (policy state dict,
optimizer state dict, step counters), loaded only with `weights_only=True`, so loading
one can never run code. Writing goes to a temporary file that is fsynced and renamed,
then the directory is fsynced, so a crash leaves either the old or the new checkpoint,
never half of one. A corrupt newest checkpoint makes `load_latest` fall back to the
previous one with a warning. A learner group's surviving ranks write their own into
`rescue-rank<N>/` beside rank 0's when the group breaks (rank 0 may be the one that
died); `load_newest` resumes from whichever holds the most steps. `write_atomic` is the
same discipline for any output file: on a failure (a full disk) it removes its temporary
file and raises OutputError naming the directory, the bytes needed and the bytes free.
No training logic here.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from hetrl.rollout.errors import OutputError

log = logging.getLogger("hetrl.checkpoint")

_NAME = re.compile(r"ckpt-(\d{12})\.pt")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoints(directory: Path) -> list[Path]:
    """Checkpoint files in `directory`, newest (highest step) first."""
    if not directory.is_dir():
        return []
    found: list[tuple[int, Path]] = []
    for path in directory.iterdir():
        match = _NAME.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), path))
    found.sort(key=lambda step_path: step_path[0], reverse=True)
    return [path for _, path in found]


RESCUE_GLOB = "rescue-rank*"
"""Folders in the checkpoint directory where a broken group's surviving ranks write."""


def rescue_dir(directory: Path, rank: int) -> Path:
    return directory / f"rescue-rank{rank}"


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def write_atomic(target: Path, data: bytes) -> Path:
    """Write `data` to `target` through a fsynced temporary file and a rename.

    Raises:
        OutputError: the write failed (ENOSPC, EDQUOT, EROFS, ...); no temporary file
            is left and `target`, if it existed, is untouched.
    """
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(target)
        _fsync_dir(target.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        free = _free_bytes(target.parent)
        space = f"{free:,} bytes free there" if free is not None else "free space unknown"
        raise OutputError(
            f"cannot write {target.name} in {target.parent}: {exc.strerror or exc}; it needs "
            f"{len(data):,} bytes, {space}. Free space there or point --out / "
            "--checkpoint-dir at a bigger disk."
        ) from exc
    return target


def save_checkpoint(directory: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write `state` as the checkpoint of `step`; delete all but the newest `keep`.

    Raises:
        OutputError: it could not be written; older checkpoints are untouched.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    target = write_atomic(directory / f"ckpt-{step:012d}.pt", buffer.getvalue())
    for old in checkpoints(directory)[keep:]:
        old.unlink(missing_ok=True)
    return target


def load_latest(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, or None; unreadable ones are skipped with a warning."""
    return _first_loadable(checkpoints(directory))


def load_newest(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The run's newest loadable checkpoint: `directory`'s own, or one a surviving rank
    of a broken learner group rescued into it; the most steps win (read from the file
    names: only the one resumed from is loaded), `directory`'s own on a tie (its rank 0
    outlived the break)."""
    folders = [directory, *sorted(directory.glob(RESCUE_GLOB))]
    found = [(int(_NAME.fullmatch(path.name).group(1)), order, path)  # type: ignore[union-attr]
             for order, folder in enumerate(folders) for path in checkpoints(folder)]
    found.sort(key=lambda item: (-item[0], item[1]))
    return _first_loadable([path for _, _, path in found])


def _first_loadable(paths: list[Path]) -> tuple[Path, dict[str, Any]] | None:
    for path in paths:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # truncated, corrupt, or not ours
            log.warning("checkpoint %s is unreadable (%s); trying the previous one", path, exc)
            continue
        if not isinstance(state, dict) or "policy" not in state:
            log.warning("checkpoint %s has no policy state; trying the previous one", path)
            continue
        return path, state
    return None
