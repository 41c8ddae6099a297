"""A user's folder goes first on a child's import path, even where it was on the path
already, behind an installed package of the same name (rollout/userpath.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_the_users_folder_wins_over_an_installed_package_of_the_same_name(
        tmp_path: Path) -> None:
    installed, user = tmp_path / "site", tmp_path / "project"
    (installed / "tests").mkdir(parents=True)  # some wheels ship a top-level `tests`
    (installed / "tests" / "__init__.py").write_text("")
    (user / "tests" / "envs").mkdir(parents=True)
    (user / "tests" / "__init__.py").write_text("")
    (user / "tests" / "envs" / "__init__.py").write_text("MAZE = 'the user\\'s'\n")
    # As an editable install leaves it: the folder on the path, behind the installed one.
    code = ("import sys; sys.path[:0] = [sys.argv[1]]; sys.path.append(sys.argv[2]); "
            "from hetrl.rollout.userpath import user_modules_importable; "
            "user_modules_importable(); import tests.envs; print(tests.envs.MAZE)")
    proc = subprocess.run([sys.executable, "-c", code, str(installed), str(user)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, HETRL_USER_PATH=str(user)))
    assert proc.returncode == 0 and proc.stdout.strip() == "the user's", proc.stderr
