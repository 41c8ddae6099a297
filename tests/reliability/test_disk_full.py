"""A disk that fills up under --out during a real `hetrl local` run (a small tmpfs the
test mounts, then fills): metrics degrade with one warning per sink, training goes on,
every failed write names its directory and the space it needed, the final model and
checkpoint are written into the space the learner kept for them, and no temporary file
is left. Skipped where tmpfs cannot be mounted."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from tests.helpers import ROOT, processes_mentioning, wait_for


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> int:
    """Write a file until the disk is full; returns its size."""
    written = 0
    with (directory / "filler").open("wb", buffering=0) as f:
        chunk = b"\0" * 4096
        while True:
            try:
                written += f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return written


def last_step(log: Path) -> int:
    steps = re.findall(r"step\s+([\d,]+)/", log.read_text())
    return int(steps[-1].replace(",", "")) if steps else 0


def test_full_disk_keeps_the_model_degrades_metrics_and_names_the_directory(
        measured, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "2m") as disk:
        out = disk / "run"
        launcher_log = tmp_path / "launcher.log"
        with launcher_log.open("w") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "hetrl.launch", "local", "--out", str(out),
                 "--workers", "1", "--envs-per-worker", "4", "--total-steps", "100000000",
                 "--checkpoint-every", "1"],
                cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(lambda: (out / "model.safetensors").exists()
                     and len(list((out / "checkpoints").glob("ckpt-*.pt"))) >= 1, 120,
                     "a periodic model and checkpoint")
            filled = fill(disk)
            at_fill = last_step(launcher_log)
            wait_for(lambda: "cannot write metrics" in launcher_log.read_text(), 60,
                     "the metrics sink to give up")
            wait_for(lambda: "training goes on" in launcher_log.read_text(), 60,
                     "a periodic save to fail")
            wait_for(lambda: last_step(launcher_log) > at_fill + 5000, 60,
                     "training to go on on a full disk")
            learner = processes_mentioning(str(out / "launch" / "learner.json"))
            os.kill(learner[0], signal.SIGTERM)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        text = launcher_log.read_text()
        model = load_file(str(out / "model.safetensors"))  # the last one that fitted
        leftovers = [p for p in disk.rglob("*") if p.name.endswith(".tmp")]
        measured(f"full disk: filled {filled:,} bytes at step {at_fill:,}; trained on to "
              f"{last_step(launcher_log):,}; metrics warnings "
              f"{text.count('cannot write metrics')}; exit {code}; model arrays "
              f"{len(model)}; temp files left {leftovers}")
        # The final model and checkpoint went into the space kept for them: the stop
        # succeeded, deterministically, whatever filled the disk.
        assert code == 0, text[-3000:]
        assert model and not leftovers
        from safetensors import safe_open

        with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
            assert int(f.metadata()["global_step"]) > at_fill  # the final one
        assert 1 <= text.count("cannot write metrics") <= 2  # once per sink at most
        assert re.search(r"cannot write \S+ in \S+: No space left on device; it needs "
                         r"[\d,]+ bytes, [\d,]+ bytes free there.*into the space kept for it",
                         text), text
        assert "Traceback" not in text
    wait_for(lambda: processes_mentioning(str(out)) == [], 30, "children to exit")
