"""The one table of exit codes: distinct, and readable by a launcher without torch."""

from __future__ import annotations

import subprocess
import sys

from hetrl.rollout import exits


def test_exit_codes_are_distinct() -> None:
    codes = {name: value for name, value in vars(exits).items() if name.startswith("EXIT_")}
    assert len(set(codes.values())) == len(codes), codes


def test_supervisors_read_exit_codes_without_importing_torch() -> None:
    probe = ("import sys, hetrl.rollout.exits, hetrl.launch.supervisor; "
             "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "False"
