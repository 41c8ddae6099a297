"""The README's own-environment example runs as written: its two code blocks become
my_pkg/envs.py and train.py in an empty folder, and train.py trains (with a smaller step
budget) and prints what the README says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT


def _blocks_after(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_own_environment_example_runs_as_written(tmp_path: Path) -> None:
    blocks = _blocks_after("## Your own environment, from Python")
    env_code = next(b for b in blocks if b.startswith("# my_pkg/envs.py"))
    train_code = next(b for b in blocks if b.startswith("# train.py"))
    assert "total_steps=100_000" in train_code
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "envs.py").write_text(env_code)
    (tmp_path / "train.py").write_text(train_code.replace("total_steps=100_000",
                                                          "total_steps=20_000"))
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ok_line, action_line = proc.stdout.strip().splitlines()[-2:]
    assert ok_line.startswith("True ") and "runs/maze/model.safetensors" in ok_line
    assert action_line == "1", proc.stdout  # it learned to walk right
