"""Run reports and prices: deliberately learner-bound and experience-bound local runs must
be reported as such, with the numbers to show it (the verdict's arithmetic alone:
tests/learner/test_verdict.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetrl.launch import run_local
from hetrl.launch.prices import cost_per_million_steps, load_prices
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
    assert "cost per million env steps" in table and "improvement of B over A" in table
    assert "learner-bound" in table and "experience-bound" in table
    # Different envs and algorithms: not a comparison of hardware alone, and it says so.
    assert "Warning: the runs differ in more than their instances" in table
    assert "env: 'CartPole-v1' -> 'tests.fixtures.envs:SlowStep'" in table
    assert "| cost to reach mean return 1e+09 | not reached | not reached |" in table
    same = compare(bound.path, bound.path, target_return=0.0)
    assert "Warning" not in same and "cost to reach mean return 0 | $" in same


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
    with pytest.raises(ConfigError, match="no summary.json"):
        Run(tmp_path)
