"""Where a user's modules (`--env my_pkg.envs:Maze`, `--policy`, `--env-import`) are found.

hetrl is imported first, then the user's folder goes to the front of the import path,
exactly where `python -m` would have put it: a user's module then wins over a same-named
installed package (some wheels ship a top-level `tests`), but can never replace hetrl's
own code, which is already loaded under its `hetrl.` namespace. The launcher passes its
working directory to children in HETRL_USER_PATH (they start with `python -P`, so that
nothing of the user's is on their path before hetrl is imported).
"""

from __future__ import annotations

import os
import sys

USER_PATH_ENV = "HETRL_USER_PATH"


def user_modules_importable() -> None:
    """Put the user's folder (HETRL_USER_PATH, else the current directory) first on
    sys.path; call it after hetrl itself is imported (any hetrl entry point). First even
    where it was on the path already, further back: an editable install puts its
    checkout there (a .pth line), behind the installed packages."""
    folder = os.environ.get(USER_PATH_ENV) or os.getcwd()
    sys.path[:] = [folder, *(entry for entry in sys.path if entry != folder)]
