"""Env factories the benchmarks pass as `--env bench.envs:NAME` (hetrl's entry-point form).

`make_pong` is ALE Pong-v5 as the Atari literature trains it: frame skip 4 (done by
AtariPreprocessing, so the ALE env itself must not skip), 84x84 grayscale, 4-frame
stacks, uint8 observations of shape (4, 84, 84). The ROM ships inside ale-py;
AtariPreprocessing needs OpenCV (`opencv-python-headless`). `LaggyCartPole` is
CartPole-v1 whose first env on one worker is slow or stalls now and then (bench/lag.py
injects policy lag with it). `SlowSim` stands for a custom simulator whose step
takes ~10 ms (8 ms waiting on an engine, 2 ms of CPU); `make_heavy_humanoid` is a real
one: MuJoCo Humanoid-v5 simulating 60 physics steps per env step (~13 ms here)
(bench/slow_env.py). `FaultyCartPole` raises on a share of its steps and, once in the
whole run, takes 30 s over a reset (bench/soak.py). `CartPoleNoVel` is CartPole-v1
with the velocities hidden, the memory benchmark of recurrent policies (bench/memory.py).
Nothing else lives here.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv

from hetrl.rollout.serving import worker_seed

# Set by bench/lag.py in the launcher's environment, which every worker inherits.
SLOW_WORKER = "HETRL_BENCH_SLOW_WORKER"
STEP_SLEEP = "HETRL_BENCH_STEP_SLEEP"
STALL_EVERY = "HETRL_BENCH_STALL_EVERY"
STALL_SECONDS = "HETRL_BENCH_STALL_SECONDS"


class LaggyCartPole(CartPoleEnv):
    """CartPole-v1 (500-step limit) whose env 0 of worker $HETRL_BENCH_SLOW_WORKER sleeps
    $HETRL_BENCH_STEP_SLEEP s per step (that worker runs slower than the others: its
    fragments arrive older) and, every $HETRL_BENCH_STALL_EVERY s, stalls for
    $HETRL_BENCH_STALL_SECONDS (a frozen host). Which worker and env it is comes from the
    seed of its first reset: worker_seed(seed, worker) + env index."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self.slow = False
        self._steps = 0
        self._last_stall = time.monotonic()
        self.step_sleep = float(os.environ.get(STEP_SLEEP, "0"))
        self.stall_every = float(os.environ.get(STALL_EVERY, "0"))
        self.stall_seconds = float(os.environ.get(STALL_SECONDS, "0"))

    def reset(self, *, seed=None, options=None):
        if seed is not None and SLOW_WORKER in os.environ:
            slow = int(os.environ[SLOW_WORKER])
            # worker_seed(s, w) = s * 10_007 + w * 101; env j is reset with that + j.
            self.slow = (seed - worker_seed(0, slow)) % 10_007 == 0
        self._steps = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.slow:
            if self.step_sleep:
                time.sleep(self.step_sleep)
            now = time.monotonic()
            if self.stall_every and now - self._last_stall > self.stall_every:
                time.sleep(self.stall_seconds)
                self._last_stall = time.monotonic()
        obs, reward, terminated, truncated, info = super().step(action)
        self._steps += 1
        return obs, reward, terminated, truncated or self._steps >= 500, info


def make_pong(**kwargs) -> gym.Env:
    """ALE/Pong-v5 with AtariPreprocessing(84x84 grayscale, skip 4) + 4-frame stacks."""
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, **kwargs)
    env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True)
    return FrameStackObservation(env, 4)


class SlowSim(CartPoleEnv):
    """CartPole-v1 whose step takes ~10 ms: 8 ms of sleep (waiting on an engine or a
    device) and ~2 ms of CPU work, like many custom simulators."""

    SLEEP, BUSY = 0.008, 0.002

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self._steps = 0

    def reset(self, *, seed=None, options=None):
        self._steps = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(self.SLEEP)
        end = time.perf_counter() + self.BUSY
        while time.perf_counter() < end:
            pass
        obs, reward, terminated, truncated, info = super().step(action)
        self._steps += 1
        return obs, reward, terminated, truncated or self._steps >= 500, info


def make_heavy_humanoid(**kwargs) -> gym.Env:
    """MuJoCo Humanoid-v5 with frame_skip 200 (40x the default): a CPU-heavy simulator of
    ~7-8 ms a step, all of it CPU (the hard kind of slow: it competes with the learner)."""
    return gym.make("Humanoid-v5", frame_skip=200, **kwargs)


_PROCESS_BORN = time.monotonic()
STEP_FAULT_RATE = "HETRL_BENCH_STEP_FAULT_RATE"
SLOW_RESET_FLAG = "HETRL_BENCH_SLOW_RESET_FLAG"
SLOW_RESET_SECONDS = "HETRL_BENCH_SLOW_RESET_SECONDS"


class FaultyCartPole(CartPoleEnv):
    """CartPole-v1 whose steps raise with probability $HETRL_BENCH_STEP_FAULT_RATE, and
    one of whose resets, once in the run (the first env to create the file
    $HETRL_BENCH_SLOW_RESET_FLAG, a minute or more into its worker's life), takes
    $HETRL_BENCH_SLOW_RESET_SECONDS (default 30)."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self._steps = 0
        self.rate = float(os.environ.get(STEP_FAULT_RATE, "0"))
        self._rng = __import__("random").Random(os.getpid() ^ id(self))

    def reset(self, *, seed=None, options=None):
        self._steps = 0
        flag = os.environ.get(SLOW_RESET_FLAG)
        if flag and time.monotonic() - _PROCESS_BORN > 60:  # envs are recreated often
            try:
                fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(time.time()).encode())
                os.close(fd)
                time.sleep(float(os.environ.get(SLOW_RESET_SECONDS, "30")))
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.rate and self._rng.random() < self.rate:
            raise RuntimeError("simulator fault (bench.soak)")
        obs, reward, terminated, truncated, info = super().step(action)
        self._steps += 1
        return obs, reward, terminated, truncated or self._steps >= 500, info


class CartPoleNoVel(gym.ObservationWrapper):
    """CartPole-v1 with its velocities hidden: the cart's position and the pole's angle
    only (observations 0 and 2), the standard memory benchmark: a policy must infer the
    velocities from what it saw before (bench/memory.py)."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(gym.make("CartPole-v1", render_mode=render_mode))
        full = self.env.observation_space
        self.observation_space = gym.spaces.Box(full.low[[0, 2]], full.high[[0, 2]],
                                                dtype=full.dtype)

    def observation(self, observation):
        return observation[[0, 2]]
