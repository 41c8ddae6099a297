"""Fault 1 and 12 inside a worker: a failing env is recreated, its episode aborted (not
terminal, not trained on), counted; one that keeps failing is unhealthy; NaN/Inf never
reaches a fragment. Real gymnasium sync vector envs, no mocks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from hetrl.learner.vtrace import vtrace
from hetrl.rollout.collector import Collector
from hetrl.rollout.envs import make_vector_env
from hetrl.rollout.errors import EnvShapeError, EnvUnhealthyError, NonFiniteError
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import WorkerSettings
from tests.reliability import envs as fault_envs


def collector(env: str, n: int = 3, length: int = 8, **kw) -> Collector:
    getattr(fault_envs, env).made = itertools.count()  # instance 0 is the faulty one
    settings = WorkerSettings(env=f"tests.reliability.envs:{env}", envs_per_worker=n,
                              fragment_length=length, **kw)
    envs = make_vector_env(settings, n)
    policy = Policy(envs.single_observation_space, envs.single_action_space, settings)
    return Collector(envs, policy, length, seed=0, failure_rate=settings.env_failure_rate,
                     failure_window=settings.env_failure_window, nonfinite=settings.nonfinite)


def test_failing_env_is_recreated_and_its_episode_aborted() -> None:
    c = collector("FailsOnce")
    frag = c.collect()
    assert frag.env_faults == 1 and frag.episodes_aborted == 1
    # Env 0 raised in its 4th step (row 3): rows 0..3 are its aborted episode.
    assert not frag.valid[:4, 0].any(), frag.valid[:, 0]
    assert frag.valid[4:, 0].all()  # the recreated env's fresh episode is trained on
    assert not frag.terminated[:, 0].any()  # aborted, not terminal: no bootstrap to zero
    assert frag.rewards[3, 0] == 0.0
    assert frag.observations[4, 0, 0] == 0.0  # t = 0: the new env's first observation
    assert frag.observations[4, 0, 1] != frag.observations[3, 0, 1]  # a new instance
    assert frag.valid[:, 1:].all()  # other envs untouched
    assert np.isfinite(frag.observations).all()
    # V-trace on it: aborted steps get no advantage and leak nothing across the cut.
    t_len, n = frag.rewards.shape
    values = torch.randn(t_len + 1, n)
    _, adv = vtrace(torch.zeros(t_len, n), torch.from_numpy(frag.rewards), values,
                    torch.from_numpy(frag.terminated), torch.from_numpy(frag.truncated),
                    torch.from_numpy(frag.valid), gamma=0.99)
    assert (adv[:4, 0] == 0).all()
    # The aborted episode's return is never reported; healthy episodes still are.
    more = c.collect()
    assert more.env_faults == 0 and len(more.episode_returns) == 3
    assert np.allclose(more.episode_returns, 10.0)  # none mixes in the aborted episode


def test_env_that_keeps_failing_is_unhealthy_with_its_traceback() -> None:
    c = collector("AlwaysFails", n=2)  # fails on 1 step in 3: over the 25% budget
    with pytest.raises(EnvUnhealthyError) as info:
        for _ in range(20):
            c.collect()
    assert "26 of its last" in str(info.value)  # first over 25 of 100
    assert "--env-failure-rate 0.25" in str(info.value)
    assert "physics blew up again" in str(info.value)  # the env's own traceback
    assert "Traceback" in str(info.value)


def test_nan_observation_drops_the_episode_and_is_counted() -> None:
    c = collector("NaNOnce")
    frag = c.collect()
    assert frag.env_faults == 1 and frag.episodes_aborted == 1
    assert np.isfinite(frag.observations).all()  # NaN never reaches a fragment
    assert not frag.valid[:4, 0].any()


def test_nan_observation_fails_fast_when_asked() -> None:
    c = collector("NaNOnce", nonfinite="fail")
    with pytest.raises(NonFiniteError, match="nonfinite fail"):
        c.collect()


def test_rare_faults_never_exhaust_the_budget_even_without_completed_episodes() -> None:
    """A fault every 30 steps of each env, on 100-step episodes: no episode ever
    completes. The old rule (3 failures in a row without a completed episode) called
    this unhealthy after ~90 steps; a 3% fault rate is survived, faults counted."""
    c = collector("FailsEvery", n=2, length=50)
    faults = 0
    for _ in range(6):  # 300 steps per env: 10 faults each
        faults += c.collect().env_faults
    assert faults == 2 * (300 // 30)


def test_nan_on_a_fifth_of_a_percent_of_steps_is_dropped_and_counted() -> None:
    """0.2% NaN observations on 1000-step episodes: the old streak rule stopped such
    runs as unhealthy; each NaN episode is now dropped and counted, nothing else."""
    fault_envs.NaNSometimes.calls = itertools.count(1)
    c = collector("NaNSometimes", n=4, length=100)
    frags = [c.collect() for _ in range(8)]  # 3,200 steps: a NaN every 500
    faults = sum(f.env_faults for f in frags)
    assert faults >= 5 and faults == sum(f.episodes_aborted for f in frags)
    assert all(np.isfinite(f.observations).all() for f in frags)


def test_observation_of_the_wrong_shape_names_both_shapes() -> None:
    c = collector("WrongShape", n=2)
    with pytest.raises(EnvShapeError) as info:
        c.collect()
    message = str(info.value)
    assert "shape (3,)" in message and "has shape (2,)" in message, message


def test_an_env_that_cannot_reset_is_one_line_naming_the_call_and_the_log(tmp_path) -> None:
    from tests.helpers import hetrl

    out = tmp_path / "r"
    proc = hetrl("local", "--env", "tests.reliability.envs:ResetFails", "--out", str(out),
                 "--total-steps", "20000")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, output
    assert "Traceback" not in output, output  # the wall of tracebacks stays in the log
    [line] = [line for line in output.splitlines() if "is unhealthy" in line]
    assert "env tests.reliability.envs:ResetFails: its reset failed" in line
    assert "FileNotFoundError: scene file /data/scene.xml not found" in line
    log = line.rsplit("the traceback is in ", 1)[1]
    assert "Traceback" in open(log).read()
    assert output.rstrip().splitlines()[-1].startswith("hetrl: nothing was trained")


def test_an_observation_of_the_wrong_shape_is_an_env_error_not_a_failure_rate(
        tmp_path) -> None:
    import json

    from tests.helpers import hetrl

    out = tmp_path / "w"
    proc = hetrl("local", "--env", "tests.reliability.envs:WrongShape", "--out", str(out),
                 "--total-steps", "20000", "--workers", "1")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, output
    assert "the env is broken" in output and "shape (3,)" in output, output
    assert "--env-failure-rate" not in output and "add env workers" not in output
    summary_path = out / "summary.json"
    if summary_path.exists():  # the learner had started: the cause is the outcome
        summary = json.loads(summary_path.read_text())
        assert summary["verdict"] == "failed" and "the env is broken" in summary["outcome"]
