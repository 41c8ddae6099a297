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
from hetrl.rollout.errors import EnvUnhealthyError, NonFiniteError
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import WorkerSettings
from tests.reliability import envs as fault_envs


def collector(env: str, n: int = 3, length: int = 8, **kw) -> Collector:
    getattr(fault_envs, env).made = itertools.count()  # instance 0 is the faulty one
    settings = WorkerSettings(env=f"tests.reliability.envs:{env}", envs_per_worker=n,
                              fragment_length=length, **kw)
    envs = make_vector_env(settings, n)
    policy = Policy(envs.single_observation_space, envs.single_action_space, settings)
    return Collector(envs, policy, length, seed=0, failure_limit=settings.env_failure_limit,
                     nonfinite=settings.nonfinite)


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
    c = collector("AlwaysFails", n=2, env_failure_limit=3)
    with pytest.raises(EnvUnhealthyError) as info:
        for _ in range(5):
            c.collect()
    assert "3 times in a row" in str(info.value)
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
