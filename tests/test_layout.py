"""The house rules that code review would otherwise have to catch: every import of a room
goes through the `hetrl` namespace, and rooms import one way only."""

from __future__ import annotations

import re

from tests.helpers import ROOT

ROOMS = ("protos", "rollout", "learner", "launch")  # each may import only those before it
_IMPORT = re.compile(r"^\s*(?:from|import)\s+([\w.]+)", re.M)


def _python_files():
    for folder in (*ROOMS, "tests", "bench"):
        yield from (ROOT / folder).rglob("*.py")
    yield from (ROOT / "hetrl").glob("*.py")


def test_rooms_are_imported_through_the_hetrl_namespace() -> None:
    bare = [f"{path.relative_to(ROOT)}: {name}" for path in _python_files()
            for name in _IMPORT.findall(path.read_text())
            if name.split(".")[0] in ROOMS]
    assert bare == [], "import these as hetrl.<room>:\n" + "\n".join(bare)


def test_rooms_import_one_way() -> None:
    against = []
    for rank, room in enumerate(ROOMS):
        for path in (ROOT / room).rglob("*.py"):
            for name in _IMPORT.findall(path.read_text()):
                parts = name.split(".")
                if parts[0] == "hetrl" and len(parts) > 1 and parts[1] in ROOMS[rank + 1:]:
                    against.append(f"{path.relative_to(ROOT)} imports {name}")
    assert against == [], "imports against the arrows:\n" + "\n".join(against)


def test_every_hetrl_import_is_a_path_in_the_checkout() -> None:
    """What a static tool (mypy, pyright, an IDE, an import-graph tool) does, done by hand:
    resolve each `hetrl.x.y` import to hetrl/x/y.py or hetrl/x/y/__init__.py from the
    checkout alone, with nothing installed and no import hook (docs/how-it-works.md)."""
    assert all((ROOT / "hetrl" / room).is_symlink() for room in ROOMS)
    unresolved = []
    for path in _python_files():
        for name in _IMPORT.findall(path.read_text()):
            parts = name.split(".")
            if parts[0] != "hetrl":
                continue
            module = ROOT.joinpath(*parts)
            if not (module.with_suffix(".py").is_file() or (module / "__init__.py").is_file()):
                unresolved.append(f"{path.relative_to(ROOT)}: {name}")
    assert unresolved == [], "not a path in the checkout:\n" + "\n".join(unresolved)
