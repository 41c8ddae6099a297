"""Tests of rollout.collector.Collector on a deterministic counter env.

The counter env observes `step count + 100 * episode index`, pays the step count as
reward and ends after a fixed number of steps, by termination or (through gymnasium's
TimeLimit) by truncation. A NEXT_STEP SyncVectorEnv and a real Policy drive it, so the
fragments can be checked against a golden trajectory written out by hand: observations,
the valid mask on autoreset steps (also across fragment boundaries), the true final
observation after a truncation, the episode statistics, dtypes and shapes.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import TimeLimit

from hetrl.rollout.collector import Collector
from hetrl.rollout.fragments import expected_steps
from hetrl.rollout.observations import ObsLayout
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import PolicySettings


class CounterEnv(gym.Env):
    """obs = [k + 100 * episode], reward = k after the k-th step; terminates at k == length
    (length=None: never, for use under TimeLimit). Actions are ignored."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int | None) -> None:
        self.length, self.episode, self.k = length, -1, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.k + 100 * self.episode], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.k = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action)
        self.k += 1
        return self._obs(), float(self.k), self.k == self.length, False, {}


def make_env(length: int, truncate: bool):
    if truncate:
        return lambda: TimeLimit(CounterEnv(None), max_episode_steps=length)
    return lambda: CounterEnv(length)


def make_collector(specs: list[tuple[int, bool]], length: int) -> Collector:
    torch.manual_seed(0)
    envs = SyncVectorEnv([make_env(*s) for s in specs], autoreset_mode=AutoresetMode.NEXT_STEP)
    policy = Policy(
        envs.single_observation_space,
        envs.single_action_space,
        PolicySettings(normalize_observations=False),
    )
    return Collector(envs, policy, length=length, seed=0)


# Env 0 terminates after 2 steps, env 1 is truncated after 3 steps; T = 5, three fragments.
# Columns are [env 0, env 1]. Rows of observations: T + 1.
GOLDEN = [
    dict(
        observations=[[0, 0], [1, 1], [2, 2], [100, 3], [101, 100], [102, 101]],
        rewards=[[1, 1], [2, 2], [0, 3], [1, 0], [2, 1]],
        terminated=[[0, 0], [1, 0], [0, 0], [0, 0], [1, 0]],
        truncated=[[0, 0], [0, 0], [0, 1], [0, 0], [0, 0]],
        valid=[[1, 1], [1, 1], [0, 1], [1, 0], [1, 1]],
        episode_returns=[3, 6, 3],
        episode_lengths=[2, 3, 2],
    ),
    dict(
        observations=[[102, 101], [200, 102], [201, 103], [202, 200], [300, 201], [301, 202]],
        rewards=[[0, 2], [1, 3], [2, 0], [0, 1], [1, 2]],
        terminated=[[0, 0], [0, 0], [1, 0], [0, 0], [0, 0]],
        truncated=[[0, 0], [0, 1], [0, 0], [0, 0], [0, 0]],
        valid=[[0, 1], [1, 1], [1, 0], [0, 1], [1, 1]],
        episode_returns=[6, 3],
        episode_lengths=[3, 2],
    ),
    dict(
        observations=[[301, 202], [302, 203], [400, 300], [401, 301], [402, 302], [500, 303]],
        rewards=[[2, 3], [0, 0], [1, 1], [2, 2], [0, 3]],
        terminated=[[1, 0], [0, 0], [0, 0], [1, 0], [0, 0]],
        truncated=[[0, 1], [0, 0], [0, 0], [0, 0], [0, 1]],
        valid=[[1, 1], [0, 0], [1, 1], [1, 1], [0, 1]],
        episode_returns=[3, 6, 3, 6],
        episode_lengths=[2, 3, 2, 3],
    ),
]


def test_golden_fragments():
    collector = make_collector([(2, False), (3, True)], length=5)
    for i, golden in enumerate(GOLDEN):
        frag = collector.collect()
        np.testing.assert_array_equal(
            frag.observations[..., 0], golden["observations"], err_msg=f"fragment {i}"
        )
        for key in ("rewards", "terminated", "truncated", "valid"):
            expected = np.asarray(golden[key], dtype=getattr(frag, key).dtype)
            np.testing.assert_array_equal(getattr(frag, key), expected, err_msg=f"{key} {i}")
        np.testing.assert_array_equal(frag.episode_returns, golden["episode_returns"])
        np.testing.assert_array_equal(frag.episode_lengths, golden["episode_lengths"])


def test_row_after_truncation_is_true_final_observation():
    collector = make_collector([(3, True)], length=4)
    frag = collector.collect()
    assert frag.truncated[2, 0] and not frag.terminated[2, 0]
    assert frag.observations[3, 0, 0] == 3.0  # final obs of episode 0, not the reset obs 100
    assert not frag.valid[3, 0] and frag.observations[4, 0, 0] == 100.0


def test_dtypes_and_shapes():
    collector = make_collector([(2, False), (3, True), (4, False)], length=7)
    frag = collector.collect()
    # What every receiver checks a fragment against (tests/rollout/test_fragments.py).
    expected = expected_steps(7, 3, ObsLayout.box((1,), np.float32), (), np.int64)
    for key, layout in expected.items():
        if layout is None:  # a feed-forward policy's recurrent arrays
            assert getattr(frag, key) is None, key
            continue
        shape, dtype = layout
        value = getattr(frag, key)
        assert value.shape == shape, key
        assert value.dtype == dtype, key
    assert frag.episode_returns.dtype == np.float32 and frag.episode_returns.ndim == 1
    assert frag.episode_lengths.dtype == np.int64 and frag.episode_lengths.ndim == 1
    assert len(frag.episode_returns) == len(frag.episode_lengths)
    assert np.all(np.isin(frag.actions, [0, 1]))
    assert np.all(frag.logprobs <= 0.0) and np.all(np.isfinite(frag.logprobs))
    assert frag.collect_seconds >= 0.0


@pytest.mark.parametrize("length", [1, 3, 7])
def test_invariants_over_many_fragments(length):
    """Episode lengths 1..5, mixed ends; check every transition of 8 consecutive fragments."""
    specs = [(1, False), (2, True), (3, False), (5, True), (1, True)]
    collector = make_collector(specs, length=length)
    prev_last_obs, prev_done = None, np.zeros(len(specs), dtype=bool)
    seen_end = np.zeros(len(specs), dtype=bool)
    for _ in range(8):
        frag = collector.collect()
        obs = frag.observations[..., 0].astype(np.int64)
        episode, k = obs // 100, obs % 100
        if prev_last_obs is not None:  # fragments join without a gap or an overlap
            np.testing.assert_array_equal(frag.observations[0], prev_last_obs)
        done = frag.terminated | frag.truncated
        after_done = np.concatenate([prev_done[None], done[:-1]])
        np.testing.assert_array_equal(frag.valid, ~after_done)
        v = frag.valid
        # A valid transition stays inside one episode and advances the counter by one.
        np.testing.assert_array_equal(episode[1:][v], episode[:-1][v])
        np.testing.assert_array_equal(k[1:][v], k[:-1][v] + 1)
        np.testing.assert_array_equal(frag.rewards[v], k[1:][v])
        # A reset step starts the next episode and carries nothing.
        np.testing.assert_array_equal(episode[1:][~v], episode[:-1][~v] + 1)
        np.testing.assert_array_equal(k[1:][~v], 0)
        assert not frag.rewards[~v].any() and not done[~v].any()
        for n, (ep_len, truncate) in enumerate(specs):
            assert not (frag.terminated if truncate else frag.truncated)[:, n].any()
            np.testing.assert_array_equal(k[1:][done[:, n], n], ep_len)
        # Episode statistics: one entry per done step, in time-then-env order.
        steps, envs = np.nonzero(done)
        np.testing.assert_array_equal(frag.episode_lengths, [specs[n][0] for n in envs])
        np.testing.assert_allclose(
            frag.episode_returns, [specs[n][0] * (specs[n][0] + 1) / 2 for n in envs]
        )
        seen_end[envs] = True
        prev_last_obs, prev_done = frag.observations[-1].copy(), done[-1]
    assert seen_end.all()  # every env finished at least one episode
