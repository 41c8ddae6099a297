"""Step a vector env with the policy and cut the experience into fragments.

Gymnasium 1.x autoresets in NEXT_STEP mode: the step after an episode ends ignores
its action and returns the first observation of the next episode. That step is
recorded with `valid = 0` so the learner never trains on a transition that crosses
an episode boundary, and the observation the episode ended on (its true final
observation) stays in the fragment as the next row, so truncated episodes bootstrap
from it. The collector owns no sockets: it returns plain arrays.
"""

from __future__ import annotations

import dataclasses
import time

import gymnasium as gym
import numpy as np

from rollout.policy import Policy, action_dtype


@dataclasses.dataclass
class FragmentArrays:
    """One fragment, time-major: observations [T+1, N, ...], everything else [T, N]."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    logprobs: np.ndarray
    valid: np.ndarray
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    collect_seconds: float = 0.0


class Collector:
    """Keeps the env state between fragments so episodes continue across them."""

    def __init__(self, envs: gym.vector.VectorEnv, policy: Policy, length: int, seed: int):
        self.envs, self.policy, self.length = envs, policy, length
        self.num_envs = envs.num_envs
        self.obs_space = envs.single_observation_space
        self.act_shape = envs.single_action_space.shape or ()
        self.act_dtype = action_dtype(envs.single_action_space)
        self.obs, _ = envs.reset(seed=seed)
        self.autoreset = np.zeros(self.num_envs, dtype=bool)  # next step is a reset step
        self.episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)

    def collect(self) -> FragmentArrays:
        """Step T times and return the fragment."""
        start = time.perf_counter()
        t_len, n = self.length, self.num_envs
        obs = np.empty((t_len + 1, n, *self.obs_space.shape), dtype=self.obs_space.dtype)
        actions = np.empty((t_len, n, *self.act_shape), dtype=self.act_dtype)
        rewards = np.empty((t_len, n), dtype=np.float32)
        terminated = np.empty((t_len, n), dtype=bool)
        truncated = np.empty((t_len, n), dtype=bool)
        logprobs = np.empty((t_len, n), dtype=np.float32)
        valid = np.empty((t_len, n), dtype=bool)
        returns: list[float] = []
        lengths: list[int] = []
        for t in range(t_len):
            obs[t] = self.obs
            valid[t] = ~self.autoreset
            action, logp = self.policy.act(obs[t])
            actions[t], logprobs[t] = action, logp
            self.obs, reward, term, trunc, _ = self.envs.step(self.policy.env_actions(action))
            # A reset step reports reward 0 and no termination; mask it all the same.
            rewards[t] = np.where(valid[t], reward, 0.0)
            terminated[t] = term & valid[t]
            truncated[t] = trunc & valid[t]
            self.episode_return += rewards[t]
            self.episode_length += valid[t]
            done = terminated[t] | truncated[t]
            if done.any():
                returns.extend(self.episode_return[done].tolist())
                lengths.extend(self.episode_length[done].tolist())
                self.episode_return[done] = 0.0
                self.episode_length[done] = 0
            self.autoreset = done
        obs[t_len] = self.obs
        return FragmentArrays(
            observations=obs,
            actions=actions,
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            logprobs=logprobs,
            valid=valid,
            episode_returns=np.asarray(returns, dtype=np.float32),
            episode_lengths=np.asarray(lengths, dtype=np.int64),
            collect_seconds=time.perf_counter() - start,
        )
