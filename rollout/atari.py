"""The standard Atari pipeline (`--atari`), the same in training and evaluation.

On an ALE env (ale-py's AtariEnv) `atari_spec` gives what DQN, IMPALA, CleanRL's
ppo_atari and Sample Factory train on, as wrappers of the env's spec: 1-30 no-op
steps after a reset, each agent step `frame_skip` emulator frames with the last two
max-pooled, a grayscale `screen_size` square image, fire on reset where the game waits
for it, and the last `frame_stack` images stacked channels first. The base env runs at
frameskip 1 with v5's sticky actions (`repeat_action_probability`, 0.25 unless the
user says otherwise).

The two parts that apply to training only are not env wrappers, so the env a run
trains on is the env it is evaluated and played on, and reported returns are whole
games in the game's own score: episodic life (a lost life ends the value target while
the game goes on: `LifeCounter`, read by the stepper from ALE's `lives` info) and
reward clipping (`--clip-rewards`, applied to a fragment's training rewards beside
reward normalisation). No torch here.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec, WrapperSpec
from gymnasium.utils import RecordConstructorArgs

from hetrl.rollout.errors import EnvError

ALE_ENTRY_POINT = "ale_py.env:AtariEnv"


def is_ale(spec: EnvSpec) -> bool:
    """Whether gymnasium makes this spec with ale-py's AtariEnv."""
    entry = spec.entry_point
    if not isinstance(entry, str):
        entry = f"{getattr(entry, '__module__', '')}:{getattr(entry, '__name__', '')}"
    return entry == ALE_ENTRY_POINT


class FireOnReset(gym.Wrapper, RecordConstructorArgs):
    """Press FIRE after each reset in games that wait for it (Breakout, ...); a pass-
    through in the others."""

    def __init__(self, env: gym.Env) -> None:
        RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        meanings = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
        self.fires = len(meanings) >= 3 and meanings[1] == "FIRE"

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if not self.fires:
            return obs, info
        for action in (1, 2):  # FIRE, then a move: some games need both to start
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


def _wrapper(cls: type, **kwargs) -> WrapperSpec:
    return WrapperSpec(cls.__name__, f"{cls.__module__}:{cls.__name__}", kwargs)


def atari_spec(spec: EnvSpec, settings) -> EnvSpec:
    """`spec` with the pipeline `settings` ask for (`--atari` and its `--atari-*` knobs),
    each part a wrapper of the spec, so an env recreated from it (after a fault, for an
    evaluation) is the same.

    Raises:
        EnvError: the env is not an ALE env, or OpenCV is missing.
    """
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    if not is_ale(spec):
        raise EnvError(f"--atari: {settings.env} is not an ALE env (ale-py's AtariEnv); "
                       "the Atari pipeline reads the emulator's screen and lives. Leave "
                       "--atari off (--no-atari) for other pixel envs")
    try:
        import cv2  # noqa: F401  # AtariPreprocessing resizes with it
    except ImportError as exc:
        raise EnvError("--atari needs OpenCV to resize frames: pip install "
                       "'hetrl[atari]' (opencv-python-headless)") from exc
    kwargs = {**spec.kwargs, "frameskip": 1,
              "repeat_action_probability": settings.atari_sticky_actions}
    wrappers = [
        _wrapper(AtariPreprocessing, noop_max=settings.atari_noop_max,
                 frame_skip=settings.atari_frame_skip, screen_size=settings.atari_screen_size,
                 terminal_on_life_loss=False, grayscale_obs=True, grayscale_newaxis=False,
                 scale_obs=False),
        _wrapper(FireOnReset)]
    if settings.atari_frame_stack > 1:
        wrappers.append(_wrapper(FrameStackObservation, stack_size=settings.atari_frame_stack,
                                 padding_type="reset"))
    return dataclasses.replace(spec, kwargs=kwargs,
                               additional_wrappers=(*spec.additional_wrappers, *wrappers))


class LifeCounter:
    """Which envs lost a life in a step, from the `lives` an ALE env reports in its info
    (episodic life: a lost life is terminal for the value target only)."""

    def __init__(self, num_envs: int) -> None:
        self.lives = np.full(num_envs, -1, dtype=np.int64)  # -1: not known yet
        self.seen = False
        """Whether the env reports lives at all."""

    def reset(self, info: dict) -> None:
        lives = _lives(info, len(self.lives))
        if lives is not None:
            self.lives[:] = lives

    def lost(self, info: dict, ended: np.ndarray) -> np.ndarray:
        """[N] bool: lives fell in this step in a game that goes on."""
        lives = _lives(info, len(self.lives))
        if lives is None:
            return np.zeros(len(self.lives), dtype=bool)
        self.seen = True
        lost = (lives < self.lives) & (self.lives >= 0) & ~ended
        self.lives[:] = lives
        return lost


def _lives(info: dict, n: int) -> np.ndarray | None:
    if "lives" not in info:
        return None
    lives = np.asarray(info["lives"], dtype=np.int64).reshape(-1)
    if lives.shape != (n,):
        return None
    known = np.asarray(info.get("_lives", np.ones(n, dtype=bool)), dtype=bool)
    return np.where(known, lives, -1)
