"""The docs hold together: every figure table is what its records give, the site builds
with no broken link or anchor, and the README stays a front page."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import tables
from tests.helpers import ROOT


def test_every_figure_table_is_what_its_records_give() -> None:
    stale = tables.regenerate(check=True)
    assert not stale, f"run `python -m bench.tables`: {stale}"


def test_a_table_that_drifted_from_its_record_is_caught(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    shutil.copytree(ROOT / "bench" / "results", results,
                    ignore=shutil.ignore_patterns("runs", "*.png"))
    page = tmp_path / "page.md"
    page.write_text("<!-- table: solve (python -m bench.tables) -->\n<!-- end table -->\n")
    monkeypatch.setattr(tables, "RESULTS", results)
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    monkeypatch.setattr(tables, "PAGES", [page])
    assert tables.main([]) == 0 and "| 1 |" in page.read_text()
    assert tables.main(["--check"]) == 0
    record = json.loads((results / "summary_solve.json").read_text())
    record["results"]["runs"][0]["final_mean_return_100"] = 123.0  # a re-measured record
    (results / "summary_solve.json").write_text(json.dumps(record))
    assert tables.main(["--check"]) == 1
    assert "| 123.0 |" not in page.read_text()  # --check changes nothing


def test_the_cli_reference_is_the_clis_own_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "hetrl.launch.cli_reference", "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_docs_site_builds_without_a_broken_link_or_anchor(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "own-env" / "index.html").exists()
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for docstring in ("Train locally: workers and a learner", "Load a run's trained policy",
                      "Actions as the env takes them"):  # read from the code, not retyped
        assert docstring in api, f"the API page lacks {docstring!r}"


def test_the_readme_is_a_front_page_whose_links_exist() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_every_test_the_reliability_page_cites_exists() -> None:
    # The page's test column is what bench.reliability runs and records: a renamed test
    # would leave a scenario with no evidence (pytest would only say "not found").
    from bench.reliability import CITED

    page = (ROOT / "docs" / "reliability.md").read_text()
    cited = {f"tests/reliability/{t}" if not t.startswith("tests/") else t
             for t in re.findall(r"`((?:tests/[\w/]+/)?test_\w+\.py(?:::\w+)?)`", page)}
    assert len(cited) > 40 and set(CITED.findall(page)) <= cited
    missing = []
    for test in sorted(cited):
        file, _, name = test.partition("::")
        path = ROOT / file
        if not path.exists() or (name and not re.search(rf"^def {name}\(", path.read_text(),
                                                         re.M)):
            missing.append(test)
    assert not missing, missing
