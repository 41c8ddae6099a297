"""The code in README.md and docs/own-env.md runs as written.

The own-environment example's two blocks become my_pkg/envs.py and train.py in an empty
folder, and train.py trains (with a smaller step budget) and prints what the page says it
prints. The README's tour runs command by command in an empty folder, with smaller step
budgets: local, enjoy, the Python block, emulate and submit's dry run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT


def _blocks(page: str, language: str, heading: str | None = None) -> list[str]:
    text = (ROOT / page).read_text()
    if heading is not None:
        text = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_the_own_environment_example_runs_as_written(tmp_path: Path) -> None:
    blocks = _blocks("docs/own-env.md", "python")
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


def _shell_commands(block: str) -> list[str]:
    """A bash block's commands, continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    tour = "## A tour in five commands"
    commands = [c for b in _blocks("README.md", "bash", tour) for c in _shell_commands(b)]
    assert [c.split()[1] for c in commands] == ["local", "enjoy", "emulate", "submit"]
    python_block, = _blocks("README.md", "python", tour)
    (tmp_path / "tour.py").write_text(python_block.replace("total_steps=50_000",
                                                           "total_steps=4_000"))
    steps = [(c, re.sub(r"--total-steps \d+", "--total-steps 4000", c)) for c in commands]
    steps.insert(2, ("the Python block", f"{sys.executable} tour.py"))
    for shown, command in steps:
        command = re.sub(r"^hetrl ", f"{sys.executable} -m hetrl ", command)
        proc = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"{shown}\n{proc.stdout}\n{proc.stderr}"
        if shown == "the Python block":
            ok_line, action_line = proc.stdout.strip().splitlines()[-2:]
            assert ok_line.startswith("True ") and action_line in {"0", "1"}, proc.stdout
        if " submit " in command:
            assert '"InstanceGroups"' in proc.stdout
