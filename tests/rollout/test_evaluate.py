"""A trained run loads by itself and plays: `load_policy`, `evaluate` and `hetrl enjoy`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetrl import evaluate, load_policy, run_local
from tests.helpers import hetrl


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A short CartPole run with a non-default network (so loading must not guess)."""
    out = tmp_path_factory.mktemp("enjoy") / "run"
    result = run_local(env="CartPole-v1", workers=1, envs_per_worker=4, fragment_length=32,
                       total_steps=4096, hidden_sizes=(32, 16), activation="relu",
                       progress=False, out=str(out))
    assert result.ok, result.summary
    assert result.policy().settings.hidden_sizes == (32, 16)  # the result hands it back
    return out


def test_a_mistyped_keyword_is_named_with_the_nearest_settings() -> None:
    from hetrl.rollout.errors import ConfigError

    with pytest.raises(ConfigError, match="'total_step'; did you mean total_steps"):
        run_local(env="CartPole-v1", total_step=1000)


def test_load_policy_needs_no_flags_and_acts_on_one_or_many(small_run: Path) -> None:
    trained = load_policy(small_run)
    assert trained.settings.hidden_sizes == (32, 16) and trained.settings.activation == "relu"
    obs = np.zeros(4, np.float32)
    single = trained.act(obs, deterministic=True)
    assert single.shape == () and trained.action_space.contains(int(single))
    batch = trained.act(np.zeros((5, 4), np.float32))
    assert batch.shape == (5,)
    assert trained.act(obs, deterministic=True) == single  # deterministic is repeatable
    with pytest.raises(ValueError, match=r"shape \(4,\) or a batch of shape \(B, 4\)"):
        trained.act(np.zeros(3, np.float32))
    played = evaluate(trained, episodes=3, deterministic=True, seed=7)
    assert len(played.returns) == 3 and all(n >= 1 for n in played.lengths)
    assert played.returns == [float(n) for n in played.lengths]  # CartPole pays 1 per step


def test_enjoy_prints_returns_and_records_real_videos(small_run: Path, tmp_path: Path) -> None:
    videos = tmp_path / "videos"
    proc = hetrl("enjoy", str(small_run), "--episodes", "2", "--deterministic",
                 "--video", str(videos))
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    assert "2 episodes: return" in output and "±" in output
    files = sorted(videos.glob("*.mp4"))
    assert len(files) == 2, output
    import cv2

    capture = cv2.VideoCapture(str(files[0]))
    frames = 0
    while capture.read()[0]:
        frames += 1
    capture.release()
    assert frames >= 5  # a real video with the episode's frames in it


def test_enjoy_without_a_model_says_what_to_give(tmp_path: Path) -> None:
    proc = hetrl("enjoy", str(tmp_path))
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "no model.safetensors" in output, output
