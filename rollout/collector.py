"""Step a vector env with the policy and cut the experience into fragments.

Gymnasium 1.x autoresets in NEXT_STEP mode: the step after an episode ends ignores
its action and returns the first observation of the next episode. That step is
recorded with `valid = 0` so the learner never trains on a transition that crosses
an episode boundary, and the observation the episode ended on (its true final
observation) stays in the fragment as the next row, so truncated episodes bootstrap
from it. The collector owns no sockets: it returns plain arrays, the `FragmentArrays`
that rollout/fragments.py defines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from hetrl.rollout.envs import FAULT_KEY, FailureBudget
from hetrl.rollout.errors import EnvError, EnvUnhealthyError, NonFiniteError
from hetrl.rollout.fragments import FragmentArrays
from hetrl.rollout.policy import Policy, action_dtype

log = logging.getLogger("hetrl.collector")


class Collector:
    """Keeps the env state between fragments so episodes continue across them."""

    def __init__(
        self, envs: gym.vector.VectorEnv, policy: Policy, length: int, seed: int,
        remake: Callable[[], gym.vector.VectorEnv] | None = None,
        failure_rate: float = 0.25, failure_window: int = 100, nonfinite: str = "drop",
    ):
        self.envs, self.policy, self.length = envs, policy, length
        self.remake, self.nonfinite = remake, nonfinite
        # Whole-vector recreations (unguarded vector envs), budgeted per vector step.
        self.vector_budget = FailureBudget(failure_rate, failure_window)
        self.num_envs = envs.num_envs
        self.obs_space = envs.single_observation_space
        self.obs_shape = self.obs_space.shape or ()
        self.act_shape = envs.single_action_space.shape or ()
        self.act_dtype = action_dtype(envs.single_action_space)
        self.busy_since: float | None = None  # monotonic start of the running env call
        self.obs, _ = self._env_call(envs.reset, seed=seed)
        self.autoreset = np.zeros(self.num_envs, dtype=bool)  # next step is a reset step
        self.episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)
        self.total_faults = 0
        self.total_aborted = 0

    def _env_call(self, fn, *args, **kwargs):
        self.busy_since = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self.busy_since = None

    def _step(self, env_actions):
        """envs.step, or, when an unguarded vector env raises, recreate it whole and
        report every env as faulted."""
        try:
            obs, reward, term, trunc, info = self._env_call(self.envs.step, env_actions)
        except (EnvError, NonFiniteError):
            raise  # unhealthy, a wrong shape, or NaN under --nonfinite fail
        except Exception as exc:
            if self.remake is None:
                raise
            return self._remake_all(exc)
        faulted = np.zeros(self.num_envs, dtype=bool)
        if FAULT_KEY in info:
            faulted = np.asarray(info.get(f"_{FAULT_KEY}", info[FAULT_KEY]), dtype=bool)
        bad = ~np.isfinite(reward)
        if obs.dtype.kind in "fc":
            bad |= ~np.isfinite(obs.reshape(self.num_envs, -1)).all(axis=1)
        if bad.any():  # only reachable when the envs are not guarded
            if self.nonfinite == "fail" or self.remake is None:
                raise NonFiniteError(f"envs {np.flatnonzero(bad).tolist()} returned NaN/Inf "
                                     "(--nonfinite fail, or an env hetrl cannot recreate)")
            return self._remake_all(NonFiniteError("non-finite observation or reward"))
        self.vector_budget.call()
        return obs, reward, term, trunc, faulted

    def _remake_all(self, exc: Exception):
        if self.vector_budget.fail():
            raise EnvUnhealthyError(
                f"the vector env keeps failing: {self.vector_budget.describe()}; "
                f"last failure: {exc!r}"
            ) from exc
        log.warning("the vector env failed (%r); recreating all %d envs", exc, self.num_envs,
                    exc_info=exc)
        try:
            self.envs.close()
        except Exception:
            log.debug("closing the failed vector env raised", exc_info=True)
        assert self.remake is not None  # callers come here only when they can remake
        self.envs = self.remake()
        obs, _ = self._env_call(self.envs.reset)
        zeros = np.zeros(self.num_envs, dtype=bool)
        return obs, np.zeros(self.num_envs), zeros, zeros, np.ones(self.num_envs, dtype=bool)

    def collect(self) -> FragmentArrays:
        """Step T times and return the fragment."""
        start = time.perf_counter()
        t_len, n = self.length, self.num_envs
        obs = np.empty((t_len + 1, n, *self.obs_shape), dtype=self.obs_space.dtype)
        actions = np.empty((t_len, n, *self.act_shape), dtype=self.act_dtype)
        rewards = np.empty((t_len, n), dtype=np.float32)
        terminated = np.empty((t_len, n), dtype=bool)
        truncated = np.empty((t_len, n), dtype=bool)
        logprobs = np.empty((t_len, n), dtype=np.float32)
        valid = np.empty((t_len, n), dtype=bool)
        returns: list[float] = []
        lengths: list[int] = []
        episode_row = np.zeros(n, dtype=np.int64)  # first row of each env's episode here
        faults = aborted = 0
        for t in range(t_len):
            obs[t] = self.obs
            valid[t] = ~self.autoreset
            episode_row[self.autoreset] = t + 1
            action, logp = self.policy.act(obs[t])
            actions[t], logprobs[t] = action, logp
            self.obs, reward, term, trunc, faulted = self._step(self.policy.env_actions(action))
            # A reset step reports reward 0 and no termination; mask it all the same.
            rewards[t] = np.where(valid[t], reward, 0.0)
            terminated[t] = term & valid[t]
            truncated[t] = trunc & valid[t]
            if faulted.any():
                faults += int(faulted.sum())
                for i in np.flatnonzero(faulted):
                    if valid[t, i]:  # a live episode dies: drop its steps, no bootstrap
                        aborted += 1
                        valid[episode_row[i]:t + 1, i] = False
                    rewards[t, i] = 0.0
                    terminated[t, i] = truncated[t, i] = False
                    episode_row[i] = t + 1
                self.episode_return[faulted] = 0.0
                self.episode_length[faulted] = 0
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
        self.total_faults += faults
        self.total_aborted += aborted
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
            env_faults=faults,
            episodes_aborted=aborted,
        )
