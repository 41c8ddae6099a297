"""Step a vector env with the worker's own copy of the policy and cut the experience
into fragments (worker inference).

The collector joins three pieces: an `EnvStepper` (guarded, timed env calls, see
stepping.py), the CPU `Policy`, and a `FragmentBuilder` (the per-step bookkeeping:
autoreset steps, aborted episodes, episode returns; see assembly.py). Episodes continue
across fragments. It owns no sockets: it returns plain arrays, the `FragmentArrays`
that rollout/fragments.py defines. Central inference uses the stepper and the builder
without it, the first on the env host and the second on the learner.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gymnasium as gym

from hetrl.rollout.assembly import FragmentBuilder
from hetrl.rollout.envs import action_dtype, action_shape
from hetrl.rollout.fragments import FragmentArrays
from hetrl.rollout.policy import Policy
from hetrl.rollout.stepping import EnvStepper


class Collector:
    """Keeps the env state between fragments so episodes continue across them."""

    def __init__(
        self, envs: gym.vector.VectorEnv, policy: Policy, length: int, seed: int,
        remake: Callable[[], gym.vector.VectorEnv] | None = None,
        failure_rate: float = 0.25, failure_window: int = 100, nonfinite: str = "drop",
        episodic_life: bool = False,
    ):
        self.policy, self.length = policy, length
        self.stepper = EnvStepper(envs, remake, failure_rate, failure_window, nonfinite,
                                  episodic_life)
        self.num_envs = envs.num_envs
        action_space = envs.single_action_space
        self.builder = FragmentBuilder(
            envs.num_envs, length, self.stepper.layout, action_shape(action_space),
            action_dtype(action_space), self.stepper.reset(seed), policy.state_size)

    @property
    def envs(self) -> gym.vector.VectorEnv:
        """The vector env now stepped (a recreated one after a whole-vector failure)."""
        return self.stepper.envs

    @property
    def busy_since(self) -> float | None:
        """Monotonic start of the running env call, None between calls (the watchdog's)."""
        return self.stepper.busy_since

    @property
    def total_faults(self) -> int:
        return self.builder.total_faults

    @property
    def total_aborted(self) -> int:
        return self.builder.total_aborted

    def collect(self) -> FragmentArrays:
        """Step T times and return the fragment."""
        fragment = self.collect_unless(None)
        assert fragment is not None
        return fragment

    def collect_unless(self, cancelled: Callable[[], bool] | None) -> FragmentArrays | None:
        """`collect`, or None if `cancelled()` turns true between two steps (a stop: a
        slow env's fragment is not waited for; what it had stepped is never sent)."""
        start = time.perf_counter()
        while True:
            if cancelled is not None and cancelled():
                return None
            builder, state = self.builder, None
            if builder.state is not None:  # a recurrent policy: each env's memory
                actions, logprobs, state = self.policy.act_recurrent(
                    builder.obs, builder.state, builder.starting)
            else:
                actions, logprobs = self.policy.act(builder.obs)
            result = self.stepper.step(self.policy.env_actions(actions))
            fragment = builder.record(actions, logprobs, result, state)
            if fragment is not None:
                fragment.collect_seconds = time.perf_counter() - start
                return fragment
