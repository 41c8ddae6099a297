"""A trained run loads by itself and plays: `load_policy`, `evaluate` and `hetrl enjoy`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetrl import evaluate, load_policy, run_local
from tests.helpers import hetrl, processes_mentioning


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A short CartPole run with a non-default network (so loading must not guess)."""
    out = tmp_path_factory.mktemp("enjoy") / "run"
    result = run_local(env="CartPole-v1", workers=1, envs_per_worker=4, fragment_length=32,
                       total_steps=4096, hidden_sizes=(32, 16), activation="relu",
                       metrics_every=0,  # a row per update: the best is on one
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
    pytest.importorskip("moviepy")  # the video extra
    videos = tmp_path / "videos"
    proc = hetrl("enjoy", str(small_run), "--episodes", "2", "--deterministic",
                 "--video", str(videos))
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    assert "2 episodes: return" in output and "±" in output
    files = sorted(videos.glob("*.mp4"))
    assert [f.name for f in files] == ["CartPole-v1-episode-0.mp4",
                                       "CartPole-v1-episode-1.mp4"], output
    import cv2

    capture = cv2.VideoCapture(str(files[0]))
    frames = 0
    while capture.read()[0]:
        frames += 1
    capture.release()
    assert frames >= 5  # a real video with the episode's frames in it


def test_a_run_keeps_its_best_policy_and_enjoy_plays_it(small_run: Path) -> None:
    """CartPole's random episodes (~20 steps) give 100 of them early on: from then the
    learner keeps the weights whenever the mean of the last 100 beats its best."""
    summary = json.loads((small_run / "summary.json").read_text())
    best = summary["best"]
    assert best["chosen_by"] == "training return" and best["mean_return"] > 0
    assert 0 < best["global_step"] <= summary["global_step"]
    metrics = [json.loads(line)
               for line in (small_run / "metrics.jsonl").read_text().splitlines()]
    at_best = [m for m in metrics if m["global_step"] == best["global_step"]]
    assert at_best and at_best[0]["charts/mean_return_100"] == pytest.approx(best["mean_return"])
    # The best is never beaten later on (ties keep the earlier policy).
    assert max(m["charts/mean_return_100"] for m in metrics
               if m["charts/episodes"] >= 100) == pytest.approx(best["mean_return"])
    trained = load_policy(small_run, "best")
    assert float(trained.metadata["best_mean_return"]) == pytest.approx(best["mean_return"])
    proc = hetrl("enjoy", str(small_run), "--episodes", "1")
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0 and "the best policy (mean return" in output, output
    proc = hetrl("enjoy", str(small_run), "--episodes", "1", "--which", "final")
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0 and "the final policy (step" in output, output


def test_an_emulated_jobs_folder_is_enough_to_find_its_model(small_run: Path,
                                                             tmp_path: Path) -> None:
    import shutil

    model = tmp_path / "job" / "hosts" / "algo-2" / "model"
    shutil.copytree(small_run, model)
    trained = load_policy(tmp_path / "job")
    assert trained.settings.hidden_sizes == (32, 16)
    assert load_policy(tmp_path / "job", "best").metadata["best_chosen_by"]


def test_enjoy_without_a_model_says_what_to_give(tmp_path: Path) -> None:
    proc = hetrl("enjoy", str(tmp_path))
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "no model.safetensors" in output, output


def test_periodic_evaluation_runs_beside_training_and_reaches_the_report(tmp_path) -> None:
    result = run_local(env="CartPole-v1", workers=1, envs_per_worker=4, fragment_length=32,
                       total_steps=6144, eval_every=2048, eval_episodes=2, progress=False,
                       out=str(tmp_path / "run"))
    assert result.ok, result.summary
    evals = [json.loads(line) for line in
             (result.out / "eval" / "results.jsonl").read_text().splitlines()]
    assert evals and evals[-1]["global_step"] >= 6144  # the final policy was evaluated
    assert all(e["episodes"] == 2 and e["eval_return"] >= 1 for e in evals)
    assert not list((result.out / "eval").glob("step-*.safetensors"))
    # With evaluations on, the evaluator keeps the best: the first best-scoring snapshot.
    top = max(e["eval_return"] for e in evals)
    first_top = next(e for e in evals if e["eval_return"] == top)
    assert result.summary["best"]["chosen_by"] == "evaluation"
    assert result.summary["best"]["mean_return"] == pytest.approx(top)
    assert load_policy(result.out, "best").metadata["global_step"] == str(
        first_top["global_step"])
    report = (result.out / "report" / "report.md").read_text()
    assert "evaluation return at the end (deterministic)" in report
    assert processes_mentioning(str(result.out)) == []  # the evaluator stopped too


def test_evaluation_can_sample_actions_as_training_does(tmp_path) -> None:
    # For envs whose most likely action loops (MiniGrid), --no-eval-deterministic.
    result = run_local(env="CartPole-v1", workers=1, envs_per_worker=4, fragment_length=32,
                       total_steps=4096, eval_every=2048, eval_episodes=2, progress=False,
                       eval_deterministic=False, out=str(tmp_path / "run"))
    assert result.ok, result.summary
    evals = [json.loads(line) for line in
             (result.out / "eval" / "results.jsonl").read_text().splitlines()]
    assert evals and all(e["deterministic"] is False for e in evals)
    report = (result.out / "report" / "report.md").read_text()
    assert "evaluation return at the end (sampled)" in report
