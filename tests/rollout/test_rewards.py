"""Tests of rollout.rewards: reward normalisation against a slow loop, and raw returns.

The reference walks every step of every env with plain floats: the discounted return
restarts after each episode end and on invalid steps, its variance is taken over every
valid step seen so far (all envs, all fragments), and each fragment's rewards are divided
by the std after the fragment is counted, then clipped. A worker run with real envs
checks that the episode returns it reports stay in the env's own units.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetrl.rollout.collector import Collector
from hetrl.rollout.rewards import RewardNormalizer, RunningVariance
from tests.rollout.test_collector import make_collector


def random_fragments(seed: int, count: int, T: int, N: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        valid = rng.random((T, N)) > 0.1
        done = (rng.random((T, N)) < 0.1) & valid
        terminated = done & (rng.random((T, N)) < 0.5)
        truncated = done & ~terminated
        rewards = (rng.normal(size=(T, N)) * 5 + 2).astype(np.float32)
        yield rewards, terminated, truncated, valid


def reference(fragments, N: int, gamma: float, clip: float):
    returns, seen, out = [0.0] * N, [], []
    for rewards, terminated, truncated, valid in fragments:
        T = rewards.shape[0]
        for t in range(T):
            for i in range(N):
                if valid[t, i]:
                    returns[i] = returns[i] * gamma + float(rewards[t, i])
                    seen.append(returns[i])
                else:
                    returns[i] = 0.0
                if terminated[t, i] or truncated[t, i]:
                    returns[i] = 0.0
        std = math.sqrt(np.var(np.array(seen)) + 1e-8)  # the count's 1e-4 prior aside
        scaled = np.zeros((T, N))
        for t in range(T):
            for i in range(N):
                if valid[t, i]:
                    x = rewards[t, i] / std
                    scaled[t, i] = min(max(x, -clip), clip) if clip else x
        out.append(scaled)
    return out


@pytest.mark.parametrize("gamma,clip", [(0.99, 10.0), (0.9, 0.5), (0.0, 0.0)])
@pytest.mark.parametrize("seed", range(3))
def test_matches_slow_loop(seed, gamma, clip):
    fragments = list(random_fragments(seed, count=4, T=13, N=3))
    normalizer = RewardNormalizer(3, gamma, clip)
    got = [normalizer(*f) for f in fragments]
    for g, want in zip(got, reference(fragments, 3, gamma, clip), strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6)


def test_running_variance_merges_batches_like_one():
    values = np.random.default_rng(0).normal(3.0, 2.0, size=1000)
    stats = RunningVariance()
    for chunk in np.array_split(values, 7):
        stats.update(chunk)
    assert stats.mean == pytest.approx(values.mean(), rel=1e-4)
    assert stats.var == pytest.approx(values.var(), rel=1e-4)


def test_episode_returns_stay_raw():
    """Collected with a real vector env, normalised as a worker does: the training
    rewards shrink, the reported episode returns are the env's own sums."""
    collector: Collector = make_collector([(2, False), (3, True)], length=5)
    normalizer = RewardNormalizer(2, 0.99, 10.0)
    for _ in range(3):
        arrays = collector.collect()
        raw = arrays.rewards.copy()
        arrays.rewards = normalizer(arrays.rewards, arrays.terminated, arrays.truncated,
                                    arrays.valid)
        assert set(arrays.episode_returns.tolist()) <= {3.0, 6.0}  # 1+2, 1+2+3
        assert np.abs(arrays.rewards).sum() < np.abs(raw).sum()
        assert (arrays.rewards[~arrays.valid] == 0).all()
