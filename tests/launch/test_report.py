"""Run reports and prices: deliberately learner-bound and experience-bound local runs must
be reported as such, with the numbers to show it (the verdict's arithmetic alone:
tests/learner/test_verdict.py). Comparisons of two runs are tested on run directories
built here as the learner writes them (metrics.jsonl, summary.json, settings.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from hetrl.launch import run_local
from hetrl.launch.cli import main
from hetrl.launch.prices import PRICES_ENV, cost_per_million_steps, load_prices
from hetrl.launch.report import Run, compare, write_report
from hetrl.rollout.errors import ConfigError


def test_prices_table_and_override(tmp_path: Path) -> None:
    table = load_prices()
    assert table.get("ml.c5.9xlarge").price_per_hour == pytest.approx(1.836)
    assert table.get("p3.2xlarge").price_per_hour == pytest.approx(3.825)
    assert table.get("ml.p4d.24xlarge").price_per_hour == pytest.approx(37.688)
    assert table.get("ml.c5.18xlarge").vcpus == 72
    assert all(i.read for i in table.instances.values())  # every figure says when it was read
    custom = tmp_path / "prices.json"
    custom.write_text(json.dumps({"instances": {"ml.c5.9xlarge": {"price_per_hour": 1.0,
                                                                  "vcpus": 36}}}))
    assert load_prices(custom).get("ml.c5.9xlarge").price_per_hour == 1.0
    with pytest.raises(ConfigError, match="no price for 'ml.c5.99xlarge'"):
        table.get("ml.c5.99xlarge")
    # AWS's MNIST example: 1 x p3.2xlarge at 1193 ms/step vs +1 x c5.9xlarge at 184 ms/step.
    homogeneous = cost_per_million_steps(3.825, 1 / 1.193)
    heterogeneous = cost_per_million_steps(3.825 + 1.836, 1 / 0.184)
    assert 1 - heterogeneous / homogeneous == pytest.approx(0.77, abs=0.01)


def _run(tmp_path: Path, name: str, **kw) -> Run:
    result = run_local(out=str(tmp_path / name), progress=False, instance_type="ml.c5.2xlarge",
                       **kw)
    assert result.ok, result.summary
    return Run(tmp_path / name)


@pytest.mark.slow
def test_learner_bound_and_experience_bound_runs(tmp_path: Path) -> None:
    # Learner-bound: cheap CartPole steps, a learner that trains 20 epochs of 32 minibatches.
    bound = _run(tmp_path, "bound", env="CartPole-v1", workers=1, envs_per_worker=8,
                 fragment_length=32, epochs=20, minibatches=32, total_steps=8_000)
    # Experience-bound: 2 ms per env step, one cheap epoch per batch.
    starved = _run(tmp_path, "starved", env="tests.fixtures.envs:SlowStep", workers=1,
                   envs_per_worker=4, fragment_length=16, epochs=1, minibatches=1,
                   fragments_per_batch=1, total_steps=2_000)
    assert bound.summary["verdict"] == "learner-bound", bound.summary["verdict_text"]
    assert starved.summary["verdict"] == "experience-bound", starved.summary["verdict_text"]
    # The utilisation numbers agree with the verdicts.
    assert bound.mean("utilisation/worker_busy_fraction") < 0.7
    assert bound.mean("utilisation/learner_busy_fraction") > 0.8
    assert starved.mean("utilisation/learner_busy_fraction") < 0.5
    assert starved.mean("utilisation/worker_busy_fraction") > 0.7
    for run in (bound, starved):
        report = (run.path / "report" / "report.md").read_text()
        assert run.summary["verdict_text"] in report
        assert "cost per million env steps" in report
        for png in ("learning_curve.png", "steps_per_second.png", "utilisation.png",
                    "policy_lag.png"):
            if png == "learning_curve.png" and "charts/mean_return_100" not in str(run.records):
                continue
            assert (run.path / "report" / png).stat().st_size > 1000, png
    table = compare(bound.path, starved.path, target_return=1e9)
    assert "cost per million env steps" in table
    assert _row(table, "verdict")[:2] == ["learner-bound", "experience-bound"]
    # Different envs and algorithms: not a comparison of hardware alone, and it says so.
    assert "not of the hardware alone" in table
    assert _row(table, "epochs")[:2] == ["20", "1"]
    assert _row(table, "cost to mean return 1,000,000,000.0")[:2] == ["not reached"] * 2
    same = compare(bound.path, bound.path, target_return=0.0)
    assert "not of the hardware alone" not in same
    assert _row(same, "cost to mean return 0.0")[0].startswith("$")


def test_tick_labels_read_at_a_glance() -> None:
    from hetrl.launch.report import human

    assert [human(v) for v in (250, 75_000, 100_000, 1_500_000, 0.5)] == [
        "250", "75k", "100k", "1.5M", "0.5"]


def test_report_without_instance_type_says_how_to_price(tmp_path: Path) -> None:
    result = run_local(env="CartPole-v1", workers=1, total_steps=3_000, out=str(tmp_path / "r"),
                       progress=False)
    assert result.ok
    text = write_report(result.out).read_text()
    assert "pass --instance-type" in text
    with pytest.raises(ConfigError, match="not an hetrl run directory.*runs inside it: "):
        Run(tmp_path)


# -- comparing two runs, on run directories written here ----------------------------

SETTINGS = {"env": "CartPole-v1", "total_steps": 10_000, "learning_rate": 0.001,
            "ent_coef": 0.0, "seed": 1, "epochs": 4, "advantages": "vtrace",
            "worker_addresses": ["127.0.0.1:50001"], "progress": False}


def fake_run(path: Path, returns: list[float | None], step: int = 1_000,
             seconds: float = 2.0, settings: dict | None = None, summary: bool = True,
             instance_type: str = "", episodes: list[int] | None = None) -> Path:
    """A run directory as the learner leaves it: one metrics.jsonl record per update,
    `step` env steps and `seconds` apart, with the mean return(100) of `returns` (None:
    no episode had ended yet); summary.json unless the run is still going; its
    settings.json; cluster.json when it stands for `instance_type`; `episodes` ended by
    each update, where given."""
    path.mkdir(parents=True)
    records = []
    for i, value in enumerate(returns, 1):
        record: dict = {"global_step": i * step, "wall_seconds": round(i * seconds, 3),
                        "charts/SPS": step / seconds, "charts/policy_lag": 0.5,
                        "utilisation/learner_busy_fraction": 0.6,
                        "utilisation/worker_busy_fraction": 0.9}
        if value is not None:
            record["charts/episodic_return"] = value
            record["charts/mean_return_100"] = value
        if episodes is not None:
            record["charts/episodes"] = episodes[i - 1]
        records.append(record)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary:
        (path / "summary.json").write_text(json.dumps({
            "outcome": "finished", "env": SETTINGS["env"],
            "global_step": records[-1]["global_step"],
            "wall_seconds": records[-1]["wall_seconds"], "episodes": 40,
            "mean_return_100": records[-1].get("charts/mean_return_100"),
            "policy_lag_histogram": {"0": 3, "1": 2}, "workers": ["127.0.0.1:50001"],
            "verdict": "learner-bound", "verdict_text": "the learner is the bottleneck"}))
    (path / "settings.json").write_text(json.dumps({**SETTINGS, "out": str(path),
                                                    **(settings or {})}))
    if instance_type:
        (path / "cluster.json").write_text(json.dumps({"instances": [
            {"group": "local", "instance_type": instance_type, "count": 1}]}))
    return path


def _row(text: str, label: str) -> list[str]:
    """The cells after `label` in the printed table row that starts with it."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r} in:\n{text}")


# A: 6 updates of 1,000 steps, 2 s apart (500 steps/s), best 180.7 at 5,000 steps.
A_RETURNS = [None, 10.5, 40.2, 120.0, 180.7, float(np.float32(175.3))]
# B: 5 updates of 250,000 steps, 100 s apart (2,500 steps/s), best 160.0 at the end.
B_RETURNS = [None, 20.0, 90.0, 150.25, 160.0]


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    a = fake_run(tmp_path / "a", A_RETURNS)
    b = fake_run(tmp_path / "b", B_RETURNS, step=250_000, seconds=100.0,
                 settings={"learning_rate": 0.0003, "ent_coef": float(np.float32(0.93)),
                           "new_setting": True, "out": "elsewhere"})
    return a, b


def test_compare_without_instance_types(two_runs: tuple[Path, Path]) -> None:
    a, b = two_runs
    text = compare(a, b)
    assert _row(text, "env steps") == ["6,000", "1,250,000", "208.33x"]
    assert _row(text, "wall time") == ["12.0 s", "500.0 s (8 min)", "41.67x"]
    assert _row(text, "env steps / s") == ["500", "2,500", "5.00x"]
    assert _row(text, "final mean return (100)") == ["175.3", "160.0", "-15.3"]
    assert _row(text, "best mean return (100)") == ["180.7", "160.0", "-20.7"]
    assert _row(text, "reached at") == ["5,000 steps, 10.0 s", "1,250,000 steps, 500.0 s (8 min)",
                                        ""]
    assert _row(text, "verdict")[:2] == ["learner-bound", "learner-bound"]
    assert "175.300" not in text  # a float32 return, shown as people read it
    # No instance types: no cost, and one line saying how to get it instead of an error.
    assert "$" not in text
    assert "Not priced: neither run records its instance types; pass --instance-type" in text
    plot = a / "report" / "compare_b.png"
    assert f"Plot: {plot}" in text
    assert plot.stat().st_size > 1000


def test_compare_lists_only_the_settings_that_differ(two_runs: tuple[Path, Path]) -> None:
    a, b = two_runs
    text = compare(a, b)
    settings = text.split("## Settings that differ")[1].split("##")[0]
    assert _row(settings, "learning_rate") == ["0.001", "0.0003"]
    assert _row(settings, "ent_coef") == ["0", "0.93"]  # not 0.9300000071525574
    assert _row(settings, "new_setting") == ["(not recorded)", "True"]
    for same_or_incidental in ("seed", "epochs", "env", "out", "worker_addresses"):
        with pytest.raises(AssertionError, match="no row"):
            _row(settings, same_or_incidental)
    assert "None: the runs share every setting" in compare(a, a)
    (b / "settings.json").unlink()
    assert f"Not compared: no settings.json in B ({b})" in compare(a, b)


def test_target_return_default_and_explicit(two_runs: tuple[Path, Path]) -> None:
    a, b = two_runs
    default = compare(a, b)
    assert ("Target return 160.0: the lower of the two runs' best (B's); set another with "
            "--target-return.") in default
    assert _row(default, "env steps to mean return 160.0") == ["5,000", "1,250,000", "250.00x"]
    assert _row(default, "wall time to mean return 160.0") == ["10.0 s", "500.0 s (8 min)",
                                                               "50.00x"]
    given = compare(a, b, target_return=100)
    assert "Target return 100.0 (--target-return)." in given
    assert _row(given, "env steps to mean return 100.0") == ["4,000", "1,000,000", "250.00x"]
    assert _row(given, "wall time to mean return 100.0") == ["8.0 s", "400.0 s (7 min)",
                                                             "50.00x"]
    missed = compare(a, b, target_return=170)
    assert _row(missed, "env steps to mean return 170.0") == ["5,000", "not reached", ""]


def test_a_mean_of_the_first_few_episodes_is_neither_best_nor_first_to_reach(
        tmp_path: Path) -> None:
    # MiniGrid's first update read 0.80 over 2 episodes; its runs reach 0.8 near 28k steps
    lucky = fake_run(tmp_path / "lucky", [0.8, 0.3, 0.5, 0.85, 0.7], episodes=[2, 76, 157,
                                                                              240, 330])
    steady = fake_run(tmp_path / "steady", [0.1, 0.3, 0.5, 0.6, 0.75], episodes=[2, 76, 157,
                                                                               240, 330])
    text = compare(lucky, steady, target_return=0.8)
    assert _row(text, "env steps to mean return 0.8")[:2] == ["4,000", "not reached"]
    assert _row(text, "best mean return (100)")[:2] == ["0.8", "0.8"]  # 0.85 and 0.75
    assert _row(text, "reached at")[0].startswith("4,000 steps")
    # a run that never had 100 episodes is judged by what it has
    short = fake_run(tmp_path / "short", [0.2, 0.9], episodes=[2, 40])
    assert _row(compare(short, steady), "reached at")[0].startswith("2,000 steps")


def test_compare_shows_cost_when_instance_types_are_known(
        two_runs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRICES_ENV, raising=False)  # the shipped table
    a, b = two_runs
    table = load_prices()
    price = [table.get(t).price_per_hour for t in ("ml.c5.2xlarge", "ml.c5.9xlarge")]
    text = compare(a, b, "ml.c5.2xlarge", "ml.c5.9xlarge")
    assert "Not priced" not in text
    assert _row(text, "instances") == ["1 x ml.c5.2xlarge", "1 x ml.c5.9xlarge", ""]

    def dollars(cell: str) -> float:
        assert cell.startswith("$"), cell
        return float(cell[1:].replace(",", ""))

    per_m = _row(text, "cost per million env steps")
    for cell, p, rate in zip(per_m, price, (500, 2_500), strict=False):
        assert dollars(cell) == pytest.approx(cost_per_million_steps(p, rate), rel=1e-2)
    to_target = _row(text, "cost to mean return 160.0")
    for cell, p, seconds in zip(to_target, price, (10.0, 500.0), strict=False):
        assert dollars(cell) == pytest.approx(p * seconds / 3600, rel=1e-2)
    assert "not of the hardware alone" in text  # the runs' learning rates differ too
    # A local run priced by --instance-type beside one whose cluster.json records its own.
    c = fake_run(tmp_path / "c", B_RETURNS, instance_type="ml.c5.9xlarge")
    mixed = compare(a, c, "ml.c5.2xlarge")
    assert _row(mixed, "instances")[:2] == ["1 x ml.c5.2xlarge", "1 x ml.c5.9xlarge"]
    assert "not of the hardware alone" not in mixed
    one = compare(a, b, "ml.c5.2xlarge")
    assert _row(one, "cost per million env steps")[1:] == ["unknown", ""]
    assert "Run B is not priced: pass --instance-type" in one


def test_a_directory_that_is_not_a_run_says_what_to_do(two_runs: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    a, _ = two_runs
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"empty is not an hetrl run directory \(it has no "
                       r"summary.json or metrics.jsonl\); give the directory a run wrote"):
        compare(empty, a)
    with pytest.raises(ConfigError, match=f"runs inside it: {re.escape(str(a))}, "):
        compare(a, tmp_path)  # the folder that holds the runs
    with pytest.raises(ConfigError, match="missing is not a directory: give a run directory"):
        compare(a, tmp_path / "missing")


def test_a_run_without_episodes_says_to_wait(two_runs: tuple[Path, Path],
                                             tmp_path: Path) -> None:
    a, _ = two_runs
    young = fake_run(tmp_path / "young", [None, None], summary=False)
    with pytest.raises(ConfigError, match=r"young has no finished episode yet \(2,000 env "
                       r"steps, 2 updates in metrics.jsonl.*then compare again"):
        compare(a, young)
    # A run still going (no summary.json yet) compares once its episodes end.
    going = fake_run(tmp_path / "going", [None, 5.0, 7.26], summary=False)
    with (going / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"global_step": 4000, "wall_')  # a line the learner is writing
    text = compare(a, going)
    assert _row(text, "outcome")[1] == "running (no summary.json yet)"
    assert _row(text, "env steps")[1] == "3,000"
    assert _row(text, "final mean return (100)")[1] == "7.3"


def test_report_command_compares_two_runs(two_runs: tuple[Path, Path],
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRICES_ENV, raising=False)
    a, b = two_runs
    assert main(["report", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"report: {a / 'report' / 'report.md'}" in out
    assert "# Two runs side by side" in out
    assert _row(out, "best mean return (100)") == ["180.7", "160.0", "-20.7"]
    assert "Not priced" in out
    assert main(["report", str(a), str(b), "--instance-type", "ml.c5.2xlarge", "ml.c5.9xlarge",
                 "--target-return", "100"]) == 0
    out = capsys.readouterr().out
    assert _row(out, "cost to mean return 100.0")[0].startswith("$")
    assert main(["report", str(a), str(a.parent / "nothing-here")]) == 2
    assert "is not a directory: give a run directory" in capsys.readouterr().err
