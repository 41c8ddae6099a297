"""Settings presets per env family, chosen from the env's spaces or by --preset.

hetrl's shipped defaults are tuned on CartPole. A preset replaces some of them with
values that learn well on a family of envs: `classic` (discrete actions, vector
observations: the shipped defaults), `continuous` (Box actions: MuJoCo, Pendulum;
PPO's MuJoCo settings with reward normalisation and GAE advantages), `atari` (Atari
games: PPO's Atari settings and the standard Atari pipeline).
`auto` picks one from the spaces, `none` keeps the shipped defaults. A preset never
overrides a setting the user gave (a flag, a config file entry, a keyword, a
hyperparameter): `apply_preset` takes the names of those. This module only decides
settings; it starts nothing.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Collection
from typing import Any, TypeVar

import gymnasium as gym

from hetrl.rollout.envs import describe_env, is_ale_env
from hetrl.rollout.errors import ConfigError
from hetrl.rollout.observations import IMAGE, ObsLayout, is_image

S = TypeVar("S")

PRESETS: dict[str, dict[str, Any]] = {
    # The shipped defaults: rewards normalised by the return's std and GAE advantages
    # (CartPole solves in ~65k steps and holds 500; bench/lag.py).
    "classic": {},
    # PPO's MuJoCo settings (batch 2048 with hetrl local's 2 workers x 8 envs x 64 steps,
    # 10 epochs of 32 minibatches, lr 3e-4 annealed), on top of the shipped reward
    # normalisation and GAE advantages (bench/learning.py). Policy lag near 0.5 (one
    # credit per worker, batches of 2 fragments per worker): at lag 1 with normalised
    # rewards, Hopper's clip fraction reached 0.3-0.7 and its policy collapsed at 220k
    # steps. The batch grows with the cluster to keep that lag.
    "continuous": {
        "learning_rate": 3e-4,
        "fragments_per_batch": "auto",
        "target_policy_lag": 0.5,
        "epochs": 10,
        "minibatches": 32,
        "credits_per_worker": 1,
    },
    # PPO's Atari settings (CleanRL's ppo_atari: 128-step fragments, lr 2.5e-4, clip
    # 0.1, entropy bonus, rewards not normalised), and on an ALE env the standard Atari
    # pipeline with episodic life and reward clipping (ATARI_ENV_SIDE). `--preset atari`
    # on another env brings the training settings only.
    # Batch and lag: CleanRL's batch (2 workers x 4 envs x 128 steps = 1,024), one credit
    # per worker, lag near 1, and PPO's clip measured against the learner's policy
    # (--clip-against learner). Pong, seed 1, 2 cores (docs/atari.md): 2 x 8 envs with
    # 2 credits scored -18.9 at 1.2M steps (lag 2 under a 0.1 clip), the batch alone
    # -18.2, the batch and the learner anchor -5.2.
    "atari": {
        "fragment_length": 128,
        "envs_per_worker": 4,
        "credits_per_worker": 1,
        "fragments_per_batch": "auto",
        "target_policy_lag": 1.0,
        "clip_against": "learner",
        "learning_rate": 2.5e-4,
        "clip_coef": 0.1,
        "ent_coef": 0.01,
        "normalize_rewards": False,
        "atari": True,
        "episodic_life": True,
        "clip_rewards": True,
    },
    "none": {},
}


ATARI_ENV_SIDE = ("atari", "episodic_life", "clip_rewards")
"""The atari preset's settings that need an ALE env (its screen, lives and game
score); other pixel envs get its training settings only."""


def preset_for(observation_space: gym.Space, action_space: gym.Space,
               ale: bool = False) -> tuple[str, str]:
    """(preset name, why) for an env with these spaces: `atari` for an Atari game (`ale`),
    any other env by its actions, whatever its observations (image observations and
    image leaves get the built-in CNN from the policy, not from a preset)."""
    if ale:
        return "atari", "an Atari game (ale-py)"
    # The atari preset's training settings (raw rewards, lr 2.5e-4, 128 steps) learned
    # LitQuadrant (3x32x32 pixels) to 10.8 in 40k steps where the shipped ones reached
    # 16.0, and SpotTheLight's first version (an image and a vector) to 7.0 in 100k
    # where the shipped ones reached 14 at 34k; and a user's rewards of any scale want
    # the normalisation that the atari preset turns off (it clips an Atari game's
    # rewards instead).
    layout = ObsLayout.of(observation_space)
    images = [leaf.name for leaf in layout.leaves if leaf.encoding == IMAGE]
    if layout.nested:
        seen = f"{type(observation_space).__name__} observations" + (
            f" (image leaves {', '.join(images)}: a CNN each)" if images else "") + ", "
    elif is_image(observation_space.shape or (), observation_space.dtype):
        seen = f"image observations {observation_space.shape} (a CNN), "
    else:
        seen = ""
    if isinstance(action_space, gym.spaces.Box):
        return "continuous", f"{seen}Box actions {action_space.shape}"
    return "classic", f"{seen}{type(action_space).__name__} actions"


def changed_fields(settings: object) -> set[str]:
    """Fields whose value differs from the shipped default of their dataclass."""
    shipped = type(settings)()  # type: ignore[call-arg]
    return {f.name for f in dataclasses.fields(settings)  # type: ignore[arg-type]
            if getattr(settings, f.name) != getattr(shipped, f.name)}


def apply_preset(settings: S, explicit: Collection[str] | None = None) -> tuple[S, str]:
    """Settings with the preset's values for every field the user did not give, the
    `preset` field naming the preset applied; and a line saying what was done.

    `explicit` names the fields the user set; None: every field whose value differs from
    the shipped default counts as set (a settings object built in Python).

    Raises:
        ConfigError: an unknown preset. EnvError: --preset auto and an env that cannot
            be made.
    """
    requested = settings.preset  # type: ignore[attr-defined]
    if requested == "auto":
        spaces = describe_env(settings)  # type: ignore[arg-type]
        name, why = preset_for(spaces.observation_space, spaces.action_space, spaces.ale)
        why = f"from the env's spaces: {why}"
    elif requested in PRESETS:
        name, why = requested, "--preset"
    else:
        raise ConfigError(f"--preset {requested!r}: choose auto, none or one of "
                          f"{', '.join(p for p in PRESETS if p != 'none')}")
    if explicit is None:
        explicit = changed_fields(settings)
    fields = {f.name for f in dataclasses.fields(settings)}  # type: ignore[arg-type]
    preset = dict(PRESETS[name])
    # auto chose atari from the env itself (an ALE env); a named preset is checked here
    if (name == "atari" and requested != "auto" and "atari" in fields
            and not is_ale_env(settings)):  # type: ignore[arg-type]
        preset = {k: v for k, v in preset.items() if k not in ATARI_ENV_SIDE}
    values = {k: v for k, v in preset.items() if k in fields and k not in explicit}
    kept = sorted(k for k in preset if k in fields and k in explicit)
    changed = ", ".join(f"{k}={v}" for k, v in values.items()) or "the shipped defaults"
    line = f"preset {name} ({why}): {changed}"
    if kept:
        line += f"; yours kept: {', '.join(kept)}"
    return dataclasses.replace(settings, preset=name, **values), line  # type: ignore[type-var]


def announce(line: str) -> None:
    """Print the preset line at the start of a run, beside the launcher's first line."""
    print(f"hetrl: {line}", file=sys.stderr, flush=True)
