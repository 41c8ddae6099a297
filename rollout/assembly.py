"""Cut one env group's steps into fragments, with the bookkeeping every fragment needs.

Gymnasium 1.x autoresets in NEXT_STEP mode: the step after an episode ends ignores
its action and returns the first observation of the next episode. That step is
recorded with `valid = 0` so the learner never trains on a transition that crosses
an episode boundary, and the observation the episode ended on (its true final
observation) stays in the fragment as the next row, so truncated episodes bootstrap
from it. An env that faulted loses its live episode: that episode's steps in the
fragment get `valid = 0` and nothing bootstraps from it. Episode returns and lengths
are counted as episodes end.

A `FragmentBuilder` is fed one step at a time (the observations the actions were
chosen from are its own `obs`; it is told the actions, their log-probabilities and
what the envs returned) and hands back a `FragmentArrays` every `length` steps. A
worker runs one beside its envs (worker inference); the learner runs one per env group
of each central-inference stream, so both places cut fragments the same way. It steps
no env, runs no policy and owns no socket; no torch.
"""

from __future__ import annotations

import time

import numpy as np

from hetrl.rollout.fragments import STEP_FIELDS, FragmentArrays
from hetrl.rollout.observations import Obs, ObsLayout, leaves, tree_map
from hetrl.rollout.stepping import StepResult


class FragmentBuilder:
    """Episode state of `num_envs` envs across fragments, and the fragment being filled."""

    def __init__(self, num_envs: int, length: int, obs_layout: ObsLayout,
                 action_shape: tuple[int, ...], action_dtype: np.dtype, first_obs: Obs,
                 state_size: int = 0) -> None:
        self.num_envs, self.length = num_envs, length
        self.obs_layout = obs_layout
        self.state_size = state_size
        self.state = np.zeros((num_envs, state_size), np.float32) if state_size else None
        """A recurrent policy's hidden state per env, as it stands before the next step
        (the caller sets it with each `record`); None for a feed-forward policy."""
        self.starting = np.ones(num_envs, dtype=bool)
        """Which envs' `obs` begins an episode: their hidden state is zero before it."""
        self.action_shape, self.action_dtype = action_shape, action_dtype
        self.obs = first_obs
        """What the next actions are chosen from: the envs' newest observations."""
        self.autoreset = np.zeros(num_envs, dtype=bool)  # next step is a reset step
        self.episode_return = np.zeros(num_envs, dtype=np.float64)
        self.episode_length = np.zeros(num_envs, dtype=np.int64)
        self.total_faults = 0
        self.total_aborted = 0
        self._begin()

    def _begin(self) -> None:
        t_len, n = self.length, self.num_envs
        self.t = 0
        self.started = time.perf_counter()
        self._obs = self.obs_layout.empty(t_len + 1, n)
        self._actions = np.empty((t_len, n, *self.action_shape), dtype=self.action_dtype)
        self._rewards = np.empty((t_len, n), dtype=np.float32)
        self._terminated = np.empty((t_len, n), dtype=bool)
        self._truncated = np.empty((t_len, n), dtype=bool)
        self._logprobs = np.empty((t_len, n), dtype=np.float32)
        self._valid = np.empty((t_len, n), dtype=bool)
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self._episode_row = np.zeros(n, dtype=np.int64)  # first row of each env's episode
        self._faults = self._aborted = 0
        if self.state is not None:  # the sequence this fragment replays starts here
            self._starts = np.empty((t_len + 1, n), dtype=bool)
            self._initial_state = self.state[None].copy()

    def record(self, actions: np.ndarray, logprobs: np.ndarray, result: StepResult,
               state: np.ndarray | None = None) -> FragmentArrays | None:
        """Record one step: `actions` (as sampled, before any env mapping) chosen from
        `self.obs` with `logprobs`, and `result`, what the envs returned; a recurrent
        policy's `state` is its hidden state after choosing them. Returns the fragment
        once it holds `length` steps (and starts the next one), else None."""
        t = self.t
        valid = ~self.autoreset
        _put(self._obs, t, self.obs)
        if self.state is not None:
            assert state is not None, "a recurrent policy's step gives its new state"
            self._starts[t] = self.starting
            self.state = state
        # A reset step (or a recreated env) returns the first observation of an episode.
        self.starting = ~valid | result.faulted
        self._valid[t] = valid
        self._episode_row[self.autoreset] = t + 1
        self._actions[t], self._logprobs[t] = actions, logprobs
        self.obs = result.observations
        # A reset step reports reward 0 and no termination; mask it all the same.
        rewards = self._rewards[t]
        rewards[:] = np.where(valid, result.rewards, 0.0)
        terminated = self._terminated[t]
        truncated = self._truncated[t]
        terminated[:] = result.terminated & valid
        truncated[:] = result.truncated & valid
        faulted = result.faulted
        if faulted.any():
            self._faults += int(faulted.sum())
            for i in np.flatnonzero(faulted):
                if valid[i]:  # a live episode dies: drop its steps, no bootstrap
                    self._aborted += 1
                    self._valid[self._episode_row[i]:t + 1, i] = False
                rewards[i] = 0.0
                terminated[i] = truncated[i] = False
                self._episode_row[i] = t + 1
            self.episode_return[faulted] = 0.0
            self.episode_length[faulted] = 0
        self.episode_return += rewards
        self.episode_length += self._valid[t]
        done = terminated | truncated
        if done.any():
            self._returns.extend(self.episode_return[done].tolist())
            self._lengths.extend(self.episode_length[done].tolist())
            self.episode_return[done] = 0.0
            self.episode_length[done] = 0
        self.autoreset = done
        if result.life_lost is not None:  # episodic life: the value target ends here,
            terminated |= result.life_lost & valid & ~faulted  # the game and its return go on
        self.t += 1
        if self.t < self.length:
            return None
        return self._finish()

    def _finish(self) -> FragmentArrays:
        _put(self._obs, self.length, self.obs)
        self.total_faults += self._faults
        self.total_aborted += self._aborted
        recurrent = {}
        if self.state is not None:
            self._starts[self.length] = self.starting
            recurrent = {"starts": self._starts, "initial_state": self._initial_state}
        fragment = FragmentArrays(
            observations=self._obs,
            actions=self._actions,
            rewards=self._rewards,
            terminated=self._terminated,
            truncated=self._truncated,
            logprobs=self._logprobs,
            valid=self._valid,
            episode_returns=np.asarray(self._returns, dtype=np.float32),
            episode_lengths=np.asarray(self._lengths, dtype=np.int64),
            collect_seconds=time.perf_counter() - self.started,
            env_faults=self._faults,
            episodes_aborted=self._aborted,
            **recurrent,
        )
        self._begin()
        return fragment


def _put(rows: Obs, t: int, obs: Obs) -> None:
    """rows[t] = obs, leaf by leaf."""
    for row, value in zip(leaves(rows), leaves(obs), strict=True):
        row[t] = value


def join_groups(parts: list[FragmentArrays]) -> FragmentArrays:
    """One fragment of all envs from the same-length fragments of their groups (env axis
    in group order); episodes listed group by group, counters summed."""
    if len(parts) == 1:
        return parts[0]
    steps = {name: tree_map(lambda *arrays: np.concatenate(arrays, axis=1),
                            *(getattr(p, name) for p in parts))
             for name in STEP_FIELDS if getattr(parts[0], name) is not None}
    return FragmentArrays(
        **steps,
        episode_returns=np.concatenate([p.episode_returns for p in parts]),
        episode_lengths=np.concatenate([p.episode_lengths for p in parts]),
        collect_seconds=max(p.collect_seconds for p in parts),
        env_faults=sum(p.env_faults for p in parts),
        episodes_aborted=sum(p.episodes_aborted for p in parts),
    )
