"""What each fault test measured, as a record: the `measured` fixture.

`python -m bench.reliability` runs the fault tests (tests/reliability and every test
docs/reliability.md cites elsewhere) with HETRL_RELIABILITY_RECORD naming a file; every
sentence a test passes to `measured` is appended there under the test's id, and the
benchmark turns the file into bench/results/summary_reliability.json, from which
`python -m bench.tables` writes docs/reliability.md's table of measured figures. A
figure a test finds is said through `measured`, never printed: a printed one has no record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from bench.reliability import RECORD_ENV


@pytest.fixture
def measured(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """`measured(sentence)`: what this test measured, in one sentence. Printed (`pytest -s`
    shows it) and, under bench.reliability, recorded with the test's id."""
    def say(sentence: str) -> None:
        print(f"\n{sentence}")
        record = os.environ.get(RECORD_ENV)
        if record:
            with open(record, "a") as out:  # one line per write: appends do not interleave
                out.write(json.dumps({"test": request.node.nodeid, "measured": sentence})
                          + "\n")
    return say
