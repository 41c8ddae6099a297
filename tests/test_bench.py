"""The benchmarks that build fragments, batches or streams by hand still run against the
product as it is: each drifted silently once (a new Fragment field, a recurrent-only
batch field) and was found broken weeks later, when `make bench` or bench/gpu_check.sh
was next run. Their --quick forms are smoke runs: exit codes only, never a figure."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.slow
def test_the_hand_built_benchmarks_run() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "transport", "pipelining",
         "learner_scale"], cwd=ROOT, capture_output=True, text=True, timeout=900,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
