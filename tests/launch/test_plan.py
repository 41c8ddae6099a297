"""`hetrl plan`: the sizing arithmetic, and its per-core figure against a real run."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from pathlib import Path

import psutil
import pytest

from hetrl.launch import run_local
from hetrl.launch.plan import (
    PlanSettings,
    group_efficiency_from_run,
    group_options,
    learner_train_settings,
    measure_core_rate,
    plan_rows,
    run_plan,
)
from hetrl.launch.prices import load_prices
from hetrl.rollout.envs import describe_env


def test_rows_follow_the_arithmetic() -> None:
    # g5.2xlarge: 8 vCPUs (6 spare after 2 learner cores); c5.9xlarge: 36 vCPUs.
    settings = PlanSettings(learner_type="ml.g5.2xlarge", env_type="ml.c5.9xlarge")
    rows = plan_rows(core_rate=1000.0, learner_rate=60_000.0, settings=settings)
    assert [r.env_hosts for r in rows] == [0, 1, 2]
    assert rows[0].env_steps_per_second == 6_000  # homogeneous: 6 spare vCPUs
    assert rows[1].env_steps_per_second == 42_000  # 6 + 36 vCPUs
    assert rows[2].env_steps_per_second == 60_000  # capped by the learner
    assert rows[2].learner_busy == pytest.approx(1.0)
    assert rows[1].price_per_hour == pytest.approx(1.515 + 1.836)
    expected = (1.515 + 2 * 1.836) / 3600 / 60_000 * 1e6
    assert rows[2].cost_per_million == pytest.approx(expected)
    assert rows[2].gain == pytest.approx(1 - expected / rows[0].cost_per_million)
    assert rows[2].spot_cost_per_million == pytest.approx(expected * 0.3)


def test_learner_group_options_follow_the_arithmetic() -> None:
    # g5.12xlarge: 4 GPUs, 48 vCPUs (46 spare); c5.9xlarge: 36 vCPUs.
    settings = PlanSettings(learner_type="ml.g5.12xlarge", env_type="ml.c5.9xlarge",
                            max_learner_count=4, max_env_hosts=10)
    options = group_options(core_rate=1000.0, learner_rate=60_000.0, settings=settings,
                            efficiency=0.8)
    assert [(o.learner_count, o.ranks) for o in options] == [(1, 4), (2, 8), (4, 16)]
    assert options[0].ceiling == pytest.approx(4 * 60_000 * 0.8)
    # 192,000 steps/s: 46,000 from the learner host's spare vCPUs, 146,000 from env
    # hosts of 36,000 each: 5 of them.
    assert options[0].env_hosts == 5
    learner_price = load_prices(None).get("ml.g5.12xlarge").price_per_hour
    assert options[0].price_per_hour == pytest.approx(learner_price + 5 * 1.836)
    assert options[1].env_hosts == 9  # (384,000 - 92,000) / 36,000, rounded up
    assert options[2].env_hosts is None  # 16 ranks need 17: more than --max-env-hosts
    # One rank alone pays no all-reduce.
    single = group_options(1000.0, 60_000.0, dataclasses.replace(
        settings, learner_type="ml.g5.2xlarge", max_learner_count=1), efficiency=0.5)
    assert single[0].ranks == 1 and single[0].ceiling == 60_000


def test_a_group_runs_summary_gives_the_all_reduce_share(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({
        "policy_version": 100, "learner_train_seconds": 10.0, "global_step": 1000,
        "learner_group": {"ranks": 2, "allreduce_seconds_per_update": 0.025}}))
    assert group_efficiency_from_run(tmp_path) == pytest.approx(0.75)
    (tmp_path / "summary.json").write_text(json.dumps({
        "policy_version": 100, "learner_train_seconds": 10.0, "global_step": 1000}))
    assert group_efficiency_from_run(tmp_path) is None


@pytest.mark.parametrize("env", ["CartPole-v1",
                                 pytest.param("Humanoid-v5", marks=pytest.mark.slow)])
def test_plan_prints_a_sane_table(env: str) -> None:
    text = run_plan(PlanSettings(env=env, measure_seconds=1.0,
                                 learner_samples_per_second=200_000))
    assert "env steps/s per core" in text and "homogeneous" in text
    assert "$/M steps" in text
    assert "saturate" in text
    assert "learner group (--learner-count" in text and "update ceiling" in text


@pytest.mark.parametrize("env", [pytest.param("MatchCode", marks=pytest.mark.slow), "CopyBits",
                                 "PointAt"])
def test_plan_measures_every_action_space(env: str) -> None:
    # The learner's update is timed too (no --learner-samples-per-second): on the
    # policy's own flat actions, not the env's shaped and offset ones.
    text = run_plan(PlanSettings(env=f"tests.fixtures.envs:{env}", measure_seconds=0.5))
    assert "env steps/s per core" in text and "$/M steps" in text


@pytest.mark.slow
def test_per_core_figure_matches_a_real_run(tmp_path: Path) -> None:
    # Both per second of CPU time, the run's from its worker process's own CPU clock,
    # so that other load on the machine (a busy test suite, two busy loops: in wall time
    # the two read 1,404 and 903) does not decide the comparison.
    settings = PlanSettings(env="Humanoid-v5", measure_seconds=4.0)
    planned = measure_core_rate(settings)
    worker_cpu: dict[int, float] = {}
    done = threading.Event()

    def watch() -> None:  # the worker's CPU seconds, read until it exits
        while not done.wait(0.2):
            for child in psutil.Process().children(recursive=True):
                try:
                    if "hetrl.rollout.worker" in " ".join(child.cmdline()):
                        cpu = child.cpu_times()
                        worker_cpu[child.pid] = cpu.user + cpu.system
                except psutil.Error:
                    continue

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run_local(env="Humanoid-v5", workers=1, total_steps=40_000,
                           out=str(tmp_path / "h"), progress=False, report=False)
    finally:
        done.set()
        watcher.join(5)
    assert result.ok
    assert len(worker_cpu) == 1, worker_cpu
    measured = result.summary["global_step"] / sum(worker_cpu.values())
    print(f"plan: {planned:,.0f} env steps per CPU second; the run's worker: {measured:,.0f}")
    # The right quantity (one worker's steps with inference, per core), not a precise one:
    # the worker's CPU clock also counts its start-up (imports, env creation) and its
    # sending, so it reads lower; a wrong quantity (no inference, all cores, env steps
    # without the policy) is off 2x or more.
    assert 0.5 < measured / planned < 1.25


def test_the_learner_is_timed_with_the_update_the_env_s_preset_trains_with() -> None:
    continuous = learner_train_settings(describe_env(PlanSettings(env="Pendulum-v1")))
    assert (continuous.epochs, continuous.minibatches, continuous.credits_per_worker) == (10, 32, 1)
    assert continuous.batch_fragments(2) == 4  # PPO's 2,048-step batch with 8 x 64 fragments
    classic = learner_train_settings(describe_env(PlanSettings(env="CartPole-v1")))
    assert (classic.epochs, classic.minibatches) == (4, 4)


def test_the_placement_choice_weighs_core_time_and_the_round_trip() -> None:
    from hetrl.launch.placement import PlacementCosts

    # A cheap env and a cheap policy: the wire and the learner's share make central lose.
    cheap = PlacementCosts(env_us=20, worker_policy_us=30, central_wire_us=7,
                           central_learner_us=40, round_trip_us=1000, group_size=8)
    assert cheap.choice() == "worker"
    # A heavy policy on a slow env: the round trip hides behind the other group's
    # stepping, and moving the policy off the env host wins.
    heavy = PlacementCosts(env_us=500, worker_policy_us=900, central_wire_us=20,
                           central_learner_us=100, round_trip_us=2000, group_size=8)
    assert heavy.choice() == "central"
    assert heavy.central_env_host_rate() == pytest.approx(1e6 / 520)
    # The same, with a round trip too long to hide: the env host waits, central loses.
    slow_wire = dataclasses.replace(heavy, round_trip_us=40_000)
    assert slow_wire.central_env_host_rate() == pytest.approx(2 * 8 * 1e6 / 40_000)
    assert slow_wire.choice() == "worker"


def test_plan_says_which_placement_wins() -> None:
    text = run_plan(PlanSettings(env="CartPole-v1", measure_seconds=1.0,
                                 learner_samples_per_second=20_000))
    assert "placement, per env step on one core" in text
    # The winner follows the measured rates it prints. Which one wins for CartPole is
    # the arithmetic's business (the test above): measured on a busy machine, a
    # descheduled timing can tip two costs this close either way.
    found = re.search(r"placement: --inference (worker|central) wins .*\(([\d,]+) vs "
                      r"([\d,]+) env steps/s per core", text)
    assert found, text
    worker, central = (int(found.group(i).replace(",", "")) for i in (2, 3))
    assert (found.group(1) == "worker") == (worker >= central) or worker == central, text
