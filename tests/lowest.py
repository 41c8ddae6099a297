"""Print pins that hold every runtime dependency of hetrl at its lower bound.

`make test-lowest` installs hetrl with these as constraints in .venv-lowest and runs the
quick tests there, so that each `>=` in pyproject.toml is a version a test has run.
torch is left out: the Makefile installs its TORCH there (PyPI's older torch releases
for this platform are multi-GB CUDA builds; pyproject.toml's torch bound says which).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
UNPINNED = {"torch"}


def lowest_pins(dependencies: list[str]) -> list[str]:
    """`name==lower` for each `name[extra]>=lower,...` requirement, but those UNPINNED.

    Raises:
        SystemExit: a requirement without a lower bound (add one: it is what this tests).
    """
    pins = []
    for requirement in dependencies:
        match = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*[^;]*?>=\s*([^,;\s]+)",
                         requirement)
        if match is None:
            raise SystemExit(f"pyproject.toml: {requirement!r} has no lower bound (>=)")
        if match.group(1).lower() not in UNPINNED:
            pins.append(f"{match.group(1)}=={match.group(3)}")
    return pins


if __name__ == "__main__":
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    print("\n".join(lowest_pins(project["dependencies"])))
    sys.exit(0)
