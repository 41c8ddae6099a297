"""The reliability tests, run as a record: what each fault test measured, in one file.

Runs `pytest tests/reliability` (every fault scenario of docs/reliability.md: real
processes, real gRPC, kills, freezes, links taken down) and every other test that page
cites (`cited_tests`), with HETRL_RELIABILITY_RECORD set, so that each test's
`measured(...)` sentence is written down with its test id (tests/conftest.py), and the
load other processes put on the machine meanwhile. Record
bench/results/summary_reliability.json; `python -m bench.tables` writes
docs/reliability.md's "measured" table from it. A test that fails or is skipped
is recorded as such, with nothing measured.
Run: `python -m bench.reliability [-k EXPR]` (about 10 minutes on 2 cores).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tyro

from bench import common

RECORD_ENV = "HETRL_RELIABILITY_RECORD"  # tests/reliability/conftest.py writes there


@dataclasses.dataclass
class Settings:
    """The reliability tests, recorded."""

    k: str = ""
    """Only the tests whose names match this pytest -k expression (the record is then
    written as summary_reliability-partial.json, never over the full one)."""


CITED = re.compile(r"`(tests/[\w/]+\.py(?:::\w+)?)`")


def cited_tests() -> list[str]:
    """The tests docs/reliability.md cites outside tests/reliability, as pytest ids."""
    page = (common.ROOT / "docs" / "reliability.md").read_text()
    return sorted({test for test in CITED.findall(page)
                   if not test.startswith("tests/reliability/")})


def run_tests(k: str) -> dict:
    """Run the reliability tests; return the record's results."""
    with tempfile.TemporaryDirectory() as tmp:
        sentences, report = Path(tmp) / "measured.jsonl", Path(tmp) / "outcomes.jsonl"
        command = [sys.executable, "-m", "pytest", "tests/reliability", *cited_tests(), "-q",
                   "-p", "no:cacheprovider", "-p", "bench.reliability",
                   *(["-k", k] if k else [])]
        env = dict(os.environ, **{RECORD_ENV: str(sentences), OUTCOMES_ENV: str(report)})
        load = common.ForeignLoad([os.getpid()], children=True).start()
        started = time.perf_counter()
        proc = subprocess.run(command, cwd=common.ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - started
        foreign = load.stop()
        print(proc.stdout[-3000:])
        measured: dict[str, list[str]] = {}
        for line in _lines(sentences):
            measured.setdefault(line["test"], []).append(line["measured"])
        tests = [{"test": o["test"], "outcome": o["outcome"],
                  "seconds": round(o["seconds"], 1), "measured": measured.get(o["test"], [])}
                 for o in _lines(report)]
    return {"exit_code": proc.returncode, "wall_seconds": round(wall, 1),
            "machine_busy_cores_foreign": round(foreign, 2), "tests": tests,
            "passed": sum(t["outcome"] == "passed" for t in tests),
            "failed": sum(t["outcome"] == "failed" for t in tests),
            "skipped": sum(t["outcome"] == "skipped" for t in tests)}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- a pytest plugin (-p bench.reliability): each test's outcome and duration -------------
OUTCOMES_ENV = "HETRL_RELIABILITY_OUTCOMES"


def pytest_runtest_logreport(report) -> None:
    """Write one line per test: passed or failed at its call, skipped or failed at set-up."""
    path = os.environ.get(OUTCOMES_ENV)
    if not path or not (report.when == "call" or (report.when == "setup"
                                                  and report.outcome != "passed")):
        return
    with open(path, "a") as out:
        out.write(json.dumps({"test": report.nodeid, "outcome": report.outcome,
                              "seconds": report.duration}) + "\n")


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    results = run_tests(s.k)
    rows = [[t["test"].split("::")[-1][:70], t["outcome"], f"{t['seconds']:.0f}",
             len(t["measured"])] for t in results["tests"]]
    common.print_table(
        f"Reliability tests: {results['passed']} passed, {results['failed']} failed, "
        f"{results['skipped']} skipped in {results['wall_seconds']:.0f} s (foreign load "
        f"{results['machine_busy_cores_foreign']:.2f} cores)",
        ["test", "outcome", "s", "sentences"], rows)
    common.write_json("summary_reliability-partial" if s.k else "summary_reliability", s,
                      results)
    return results


if __name__ == "__main__":
    main()
