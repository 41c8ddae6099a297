"""Presets: chosen from real envs' spaces, never over what the user gave, printed at the
start of a run and recorded in its settings.json."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

from hetrl.launch.presets import PRESETS, apply_preset, preset_for
from hetrl.launch.settings import ClusterSettings, LocalSettings, flags_given
from hetrl.learner.settings import TrainSettings
from hetrl.rollout.errors import ConfigError
from tests.helpers import hetrl


@pytest.mark.parametrize("env,expected", [
    ("CartPole-v1", "classic"),
    ("Acrobot-v1", "classic"),
    ("Pendulum-v1", "continuous"),
    ("Hopper-v5", "continuous"),
    ("HalfCheetah-v5", "continuous"),
])
def test_chosen_from_the_envs_spaces(env: str, expected: str) -> None:
    made = gym.make(env)
    try:
        assert preset_for(made.observation_space, made.action_space)[0] == expected
        settings, line = apply_preset(LocalSettings(env=env), set())
        assert settings.preset == expected and f"preset {expected}" in line
    finally:
        made.close()


def test_atari_games_choose_atari_and_other_pixels_their_actions() -> None:
    import ale_py

    gym.register_envs(ale_py)
    made = gym.make("ALE/Pong-v5")
    try:
        assert preset_for(made.observation_space, made.action_space, ale=True)[0] == "atari"
        # the same frames from a simulator of the user's own: chosen by its actions
        name, why = preset_for(made.observation_space, made.action_space)
        assert name == "classic" and "image observations (210, 160, 3) (a CNN)" in why
        box = gym.spaces.Box(-1, 1, (2,))
        assert preset_for(made.observation_space, box)[0] == "continuous"
    finally:
        made.close()


def test_the_atari_preset_brings_the_atari_pipeline_to_ale_envs_only() -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    settings, line = apply_preset(LocalSettings(env="ALE/Pong-v5"), set())
    assert settings.preset == "atari"
    assert settings.atari and settings.episodic_life and settings.clip_rewards
    assert "atari=True, episodic_life=True, clip_rewards=True" in line
    # A pixel env that is no Atari game: chosen by its actions; --preset atari on it
    # brings the training settings, not the Atari pipeline.
    pixels, line = apply_preset(LocalSettings(env="tests.fixtures.envs:LitQuadrant"), set())
    assert pixels.preset == "classic" and "image observations (3, 32, 32)" in line
    asked, line = apply_preset(
        LocalSettings(env="tests.fixtures.envs:LitQuadrant", preset="atari"), set())
    assert asked.learning_rate == PRESETS["atari"]["learning_rate"]
    assert not (asked.atari or asked.episodic_life or asked.clip_rewards)
    assert "atari=True" not in line
    # --preset none leaves the env raw; a user's --no-atari is kept.
    raw, _ = apply_preset(LocalSettings(env="ALE/Pong-v5", preset="none"), set())
    assert not raw.atari
    kept, line = apply_preset(LocalSettings(env="ALE/Pong-v5"), {"atari"})
    assert not kept.atari and kept.clip_rewards and "yours kept: atari" in line


def test_continuous_preset_fills_what_is_not_given() -> None:
    settings, _ = apply_preset(LocalSettings(env="Hopper-v5"), set())
    for name, value in PRESETS["continuous"].items():
        assert getattr(settings, name) == value, name
    assert settings.normalize_rewards and settings.advantages == "gae"


def test_the_continuous_batch_is_ppos_2048_steps_locally_and_grows_with_the_cluster() -> None:
    settings, _ = apply_preset(LocalSettings(env="Hopper-v5"), set())
    steps = settings.envs_per_worker * settings.fragment_length
    assert settings.batch_fragments(settings.workers) * steps == 2048  # hetrl local's 2
    assert settings.batch_fragments(14) == 28  # lag near 0.5 with 14 workers of one credit


def test_given_settings_win_over_the_preset() -> None:
    # learning_rate given at its shipped default still wins: it was given.
    given = LocalSettings(env="Hopper-v5", learning_rate=1e-3, epochs=3, credits_per_worker=2)
    settings, line = apply_preset(given, {"learning_rate", "epochs", "credits_per_worker"})
    assert (settings.learning_rate, settings.epochs, settings.credits_per_worker) == (1e-3, 3, 2)
    assert settings.minibatches == 32  # from the preset
    assert "yours kept: credits_per_worker, epochs, learning_rate" in line


def test_a_settings_object_keeps_what_differs_from_the_shipped_defaults() -> None:
    settings, _ = apply_preset(LocalSettings(env="Pendulum-v1", epochs=3))
    assert settings.epochs == 3 and settings.learning_rate == 3e-4


@pytest.mark.parametrize("preset", ["none", "classic"])
def test_named_preset_overrides_the_choice(preset: str) -> None:
    settings, line = apply_preset(LocalSettings(env="Hopper-v5", preset=preset), {"preset"})
    assert settings.preset == preset and "--preset" in line
    shipped = LocalSettings()
    assert all(getattr(settings, k) == getattr(shipped, k) for k in PRESETS["continuous"])


def test_preset_names_are_the_settings_choices() -> None:
    import typing

    hints = typing.get_type_hints(TrainSettings)
    assert set(typing.get_args(hints["preset"])) == set(PRESETS) | {"auto"}
    with pytest.raises(ConfigError, match="--preset"):
        apply_preset(LocalSettings(env="CartPole-v1", preset="nosuch"), set())  # type: ignore[arg-type]


def test_flags_given_reads_every_flag_form() -> None:
    args = ["--env", "Hopper-v5", "--learning-rate=1e-3", "--no-normalize-rewards",
            "--epochs", "3", "--not-a-field", "x"]
    assert flags_given(args, LocalSettings) == {"env", "learning_rate", "normalize_rewards",
                                                 "epochs"}
    assert "learning_rate" in flags_given(["--learning-rate", "1"], ClusterSettings)


def test_cli_prints_the_preset_and_records_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = hetrl("local", "--env", "Pendulum-v1", "--workers", "1", "--envs-per-worker", "2",
                 "--fragment-length", "50", "--total-steps", "400", "--learning-rate", "1e-3",
                 "--no-progress", "--out", str(out))
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    assert "preset continuous (from the env's spaces: Box actions (1,))" in output
    assert "yours kept: learning_rate" in output
    recorded = json.loads((out / "settings.json").read_text())
    assert recorded["preset"] == "continuous"
    assert recorded["learning_rate"] == 1e-3 and recorded["epochs"] == 10
    assert recorded["advantages"] == "gae"
    worker = json.loads((out / "launch" / "worker-0.json").read_text())
    assert worker["normalize_rewards"] is True  # a worker's setting, shipped on


def test_job_hyperparameters_and_flags_win_over_the_preset() -> None:
    from types import SimpleNamespace

    from hetrl.launch.host import settings_for

    job = SimpleNamespace(hyperparameters={"env": "Hopper-v5", "learning_rate": "0.001"})
    settings = settings_for(job, ["--epochs", "3"])  # type: ignore[arg-type]
    assert settings.preset == "continuous" and settings.minibatches == 32
    assert settings.learning_rate == 1e-3 and settings.epochs == 3


def test_getting_starteds_preset_table_says_what_each_preset_sets() -> None:
    # The page's table quotes each preset's settings as flags; every flag there must be
    # what the preset sets, and every setting a preset changes from the shipped default
    # must be quoted (the atari row drifted once when the preset changed).
    page = (Path(__file__).parents[2] / "docs/getting-started.md").read_text()
    shipped = LocalSettings(env="CartPole-v1")
    for name, values in PRESETS.items():
        if name == "none":
            continue
        rows = [line for line in page.splitlines() if line.startswith(f"| `{name}` |")]
        assert len(rows) == 1, f"getting-started.md has no single row for preset {name}"
        spans = [span.split() for span in rows[0].split("`")[1::2]
                 if span.startswith("--") and not span.startswith("--preset")]
        quoted: dict[str, object] = {}
        for words in spans:
            for i, word in enumerate(words):
                if not word.startswith("--"):
                    continue
                key = word[2:].replace("-", "_")
                value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith(
                    "--") else None
                if value is None:
                    negated = key.startswith("no_")
                    quoted[key[3:] if negated else key] = not negated
                else:
                    quoted[key] = type(getattr(shipped, key))(value)
        changed = {k: v for k, v in values.items() if getattr(shipped, k) != v}
        assert quoted == changed, f"preset {name}: page {quoted}, preset {changed}"
