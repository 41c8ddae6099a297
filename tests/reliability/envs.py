"""Envs that fail on purpose, importable by worker processes as tests.reliability.envs:Name.

Each behaves like a tiny episodic env (obs = [t/10, instance], episodes of 10 steps)
until its fault; environment variables or class attributes choose the fault.
"""

from __future__ import annotations

import itertools
import os
import time

import gymnasium as gym
import numpy as np


class Counting(gym.Env):
    """Ten-step episodes; reward 1 per step; each instance numbered as it is made."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
    made = itertools.count()

    def __init__(self) -> None:
        self.instance = next(type(self).made)
        self.t = 0
        self.total_steps = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t / 10, self.instance], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.total_steps += 1
        cls = type(self)
        if cls.__dict__.get("first_stepper") is None:  # per class, per process
            cls.first_stepper = self.instance
        self.fault()
        return self._obs(), 1.0, False, self.t >= 10, {}

    @property
    def first(self) -> bool:
        """This is the first instance of its class in this process to step (a worker
        also makes one to read the spaces, which never steps)."""
        return type(self).__dict__.get("first_stepper") == self.instance

    def fault(self) -> None:
        """Override: raise, hang, or corrupt."""


class FailsOnce(Counting):
    """The first instance to step raises at its 4th step; every other one is healthy."""

    made = itertools.count()

    def fault(self) -> None:
        if self.first and self.total_steps == 4:
            raise RuntimeError("physics blew up (test fault)")


class AlwaysFails(Counting):
    """Raises at every instance's 3rd step."""

    made = itertools.count()

    def fault(self) -> None:
        if self.total_steps == 3:
            raise RuntimeError("physics blew up again (test fault)")


class NaNOnce(Counting):
    """The first instance to step returns a NaN observation at its 4th step."""

    made = itertools.count()

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        if self.first and self.total_steps == 4:
            obs = np.array([np.nan, 0], np.float32)
        return obs, reward, term, trunc, info


class HangsOnce(Counting):
    """Hangs forever at its 50th step unless the file HETRL_TEST_HANG_FLAG exists; it
    writes the file (with the time) first, so only the first worker process hangs.

    Every step takes 3 ms, so a run outlasts the watchdog however fast the learner
    gets: with 2 workers x 2 envs, 12,000 steps take over 8 s after a hang at the start
    (3 s of --step-timeout and a restart), where unpaced they once took 3.7 s in all
    and the run ended before the watchdog fired."""

    step_seconds = 0.003

    def step(self, action):
        time.sleep(self.step_seconds)
        return super().step(action)

    def fault(self) -> None:
        if self.total_steps != 50:
            return
        try:  # O_EXCL: exactly one env of one worker process claims the hang
            fd = os.open(os.environ["HETRL_TEST_HANG_FLAG"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(time.time()).encode())
        os.close(fd)
        while True:
            time.sleep(1)


class FailsEvery(Counting):
    """Episodes of 100 steps, but every instance raises at each 30th of its own steps:
    a fault rate of 3% on which no episode ever completes."""

    made = itertools.count()

    def step(self, action):
        obs, reward, _, _, info = super().step(action)
        return obs, reward, False, self.t >= 100, info

    def fault(self) -> None:
        if self.total_steps % 30 == 0:
            raise RuntimeError("rare physics fault (test fault)")


class NaNSometimes(Counting):
    """A NaN observation on one step in 500 of the process (0.2% of steps), episodes of
    1000 steps."""

    made = itertools.count()
    calls = itertools.count(1)

    def step(self, action):
        obs, reward, _, _, info = super().step(action)
        if next(NaNSometimes.calls) % 500 == 0:
            obs = np.array([np.nan, 0], np.float32)
        return obs, reward, False, self.t >= 1000, info


class WrongShape(Counting):
    """Announces a (2,) observation space, returns a (3,) observation from its 2nd step."""

    made = itertools.count()

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        if self.total_steps >= 2:
            obs = np.zeros(3, np.float32)
        return obs, reward, term, trunc, info


class HangsFor(Counting):
    """Like HangsOnce, but the hang ends after HETRL_TEST_HANG_SECONDS (default 60)."""

    made = itertools.count()

    def fault(self) -> None:
        if self.total_steps != 50:
            return
        try:
            fd = os.open(os.environ["HETRL_TEST_HANG_FLAG"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(time.time()).encode())
        os.close(fd)
        time.sleep(float(os.environ.get("HETRL_TEST_HANG_SECONDS", "60")))


class EveryWorkerHangsFor(Counting):
    """In every worker process, the first instance to step sleeps HETRL_TEST_HANG_SECONDS
    (default 15) once, at its 50th step; the first to hang writes the time to
    HETRL_TEST_HANG_FLAG."""

    made = itertools.count()
    hung = False

    def fault(self) -> None:
        if not self.first or self.total_steps != 50 or EveryWorkerHangsFor.hung:
            return
        EveryWorkerHangsFor.hung = True
        try:
            fd = os.open(os.environ["HETRL_TEST_HANG_FLAG"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, str(time.time()).encode())
            os.close(fd)
        except FileExistsError:
            pass
        time.sleep(float(os.environ.get("HETRL_TEST_HANG_SECONDS", "15")))


class DiesEvery(Counting):
    """A leaky simulator: the first instance to step in each worker process ends it (as
    the OOM killer would) after HETRL_TEST_DIE_AFTER steps (default 3000), or, with
    HETRL_TEST_DIE_AT_START=1, at its first step (a worker that can never deliver)."""

    made = itertools.count()

    def fault(self) -> None:
        if not self.first:
            return
        if os.environ.get("HETRL_TEST_DIE_AT_START") == "1" or (
                self.total_steps >= int(os.environ.get("HETRL_TEST_DIE_AFTER", "3000"))):
            print("MemoryError: simulator leaked (test fault)", flush=True)
            os._exit(9)


class ResetFails(Counting):
    """Every reset raises: a simulator that cannot start (a missing licence, a bad path)."""

    made = itertools.count()

    def reset(self, *, seed=None, options=None):
        raise FileNotFoundError("scene file /data/scene.xml not found (test fault)")


class SlowReset(Counting):
    """Its first reset takes HETRL_TEST_RESET_SECONDS (default 3): a simulator that loads
    its scene once."""

    made = itertools.count()
    loaded = False

    def reset(self, *, seed=None, options=None):
        if not self.loaded:
            time.sleep(float(os.environ.get("HETRL_TEST_RESET_SECONDS", "3")))
            self.loaded = True
        return super().reset(seed=seed, options=options)
