"""Env factories the benchmarks pass as `--env bench.envs:NAME` (hetrl's entry-point form).

`make_pong` is ALE Pong-v5 as the Atari literature trains it: frame skip 4 (done by
AtariPreprocessing, so the ALE env itself must not skip), 84x84 grayscale, 4-frame
stacks, uint8 observations of shape (4, 84, 84). The ROM ships inside ale-py;
AtariPreprocessing needs OpenCV (`opencv-python-headless`). Nothing else lives here.
"""

from __future__ import annotations

import gymnasium as gym


def make_pong(**kwargs) -> gym.Env:
    """ALE/Pong-v5 with AtariPreprocessing(84x84 grayscale, skip 4) + 4-frame stacks."""
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, **kwargs)
    env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True)
    return FrameStackObservation(env, 4)
