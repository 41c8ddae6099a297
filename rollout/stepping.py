"""Step a vector env safely: the one place env calls are timed, guarded and recovered.

An `EnvStepper` owns one gymnasium vector env. It resets and steps it with the env's
actions and returns plain arrays plus which envs faulted (an EnvGuard recreated them,
see envs.py). An unguarded vector env that raises, or returns NaN/Inf, is recreated
whole within its failure budget, every env reported faulted. `busy_since` says when the
running env call started, for the watchdog that ends a worker whose env hangs. It
chooses no actions and keeps no fragments: the collector (worker inference) and the env
server (central inference) build on it. No torch here, so an env host in central mode
needs none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from hetrl.rollout.atari import LifeCounter
from hetrl.rollout.envs import FAULT_KEY, FailureBudget, in_space_dtype
from hetrl.rollout.errors import EnvError, EnvUnhealthyError, NonFiniteError
from hetrl.rollout.observations import Obs, ObsLayout, finite_rows

log = logging.getLogger("hetrl.collector")


class StepResult(NamedTuple):
    """What one vector step returned: [N, *obs] observations (an array, or per leaf of
    a nested space: see observations.py), [N] the rest."""

    observations: Obs
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    faulted: np.ndarray
    """Envs that failed in this step and were recreated: their episode is lost."""
    life_lost: np.ndarray | None = None
    """Envs whose game lost a life and goes on (--episodic-life: terminal for the value
    target only); None: not asked for."""


class EnvStepper:
    """One vector env, its failure budget and the timing the watchdog reads."""

    def __init__(
        self, envs: gym.vector.VectorEnv,
        remake: Callable[[], gym.vector.VectorEnv] | None = None,
        failure_rate: float = 0.25, failure_window: int = 100, nonfinite: str = "drop",
        episodic_life: bool = False,
    ) -> None:
        self.envs, self.remake, self.nonfinite = envs, remake, nonfinite
        # Whole-vector recreations (unguarded vector envs), budgeted per vector step.
        self.vector_budget = FailureBudget(failure_rate, failure_window)
        self.num_envs = envs.num_envs
        self.layout = ObsLayout.of(envs.single_observation_space)
        self.busy_since: float | None = None  # monotonic start of the running env call
        self.lives = LifeCounter(self.num_envs) if episodic_life else None
        self._warned_no_lives = False

    def _env_call(self, fn, *args, **kwargs):
        self.busy_since = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self.busy_since = None

    def reset(self, seed: int | None = None) -> Obs:
        """Reset every env (a new episode each); return the first observations."""
        obs, info = self._env_call(self.envs.reset, seed=seed)
        if self.lives is not None:
            self.lives.reset(info)
        return self.layout.flatten(obs)

    def step(self, env_actions: np.ndarray) -> StepResult:
        """envs.step, or, when an unguarded vector env raises or returns NaN/Inf, the
        vector env recreated whole and every env reported faulted.

        Raises:
            EnvUnhealthyError: failures beyond the budget. NonFiniteError: NaN/Inf under
                --nonfinite fail. EnvError: actions or observations of the wrong shape.
        """
        env_actions = in_space_dtype(env_actions, self.envs.single_action_space)
        try:
            obs, reward, term, trunc, info = self._env_call(self.envs.step, env_actions)
        except (EnvError, NonFiniteError):
            raise  # unhealthy, a wrong shape, or NaN under --nonfinite fail
        except Exception as exc:
            if self.remake is None:
                raise
            return self._remake_all(exc)
        obs = self.layout.flatten(obs)
        faulted = np.zeros(self.num_envs, dtype=bool)
        if FAULT_KEY in info:
            faulted = np.asarray(info.get(f"_{FAULT_KEY}", info[FAULT_KEY]), dtype=bool)
        bad = ~np.isfinite(reward) | ~finite_rows(obs, self.num_envs)
        if bad.any():  # only reachable when the envs are not guarded
            if self.nonfinite == "fail" or self.remake is None:
                raise NonFiniteError(f"envs {np.flatnonzero(bad).tolist()} returned NaN/Inf "
                                     "(--nonfinite fail, or an env hetrl cannot recreate)")
            return self._remake_all(NonFiniteError("non-finite observation or reward"))
        self.vector_budget.call()
        return StepResult(obs, reward, term, trunc, faulted,
                          self._life_lost(info, term | trunc))

    def _life_lost(self, info: dict, ended: np.ndarray) -> np.ndarray | None:
        if self.lives is None:
            return None
        lost = self.lives.lost(info, np.asarray(ended, dtype=bool))
        if not self.lives.seen and not self._warned_no_lives:
            self._warned_no_lives = True
            log.warning("--episodic-life: the env reports no 'lives' in its info (ALE "
                        "envs do); no lost life ends a value target early")
        return lost

    def _remake_all(self, exc: Exception) -> StepResult:
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
        obs = self.reset()
        zeros = np.zeros(self.num_envs, dtype=bool)
        return StepResult(obs, np.zeros(self.num_envs), zeros, zeros,
                          np.ones(self.num_envs, dtype=bool))

    def close(self) -> None:
        self.envs.close()
