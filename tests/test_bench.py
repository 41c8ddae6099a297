"""The benchmarks that build fragments, batches or streams by hand still run against the
product as it is: each drifted silently once (a new Fragment field, a recurrent-only
batch field) and was found broken weeks later, when `make bench` or bench/gpu_check.sh
was next run. Their --quick forms are smoke runs: exit codes only, never a figure. The
learner group benchmark reads a group run's summary, whose fields may change the same way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT


@pytest.mark.slow
def test_the_hand_built_benchmarks_run() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "transport", "pipelining",
         "learner_scale", "group_updates", "overhead", "learner_throughput"], cwd=ROOT,
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # The suite's summary holds what docs/performance.md's tables read (bench.tables).
    head = json.loads((ROOT / "bench/results/quick-summary.json").read_text())["headline"]
    envs = head["overhead"]["envs"]
    assert {"ratio", "target", "stream_mib_per_s", "envs_per_worker"} <= set(envs["pong"])
    assert [(r["env"], r["envs_per_worker"]) for r in head["overhead"]["sweep"]] == [
        ("CartPole-v1", 1), ("CartPole-v1", 32)]
    assert {"nature cnn / Pong 4x84x84 u8 (1 thr)",
            "mlp / HalfCheetah-v5, continuous preset (1 thr)",
            "mlp / HalfCheetah-v5, continuous preset (1 thr, autograd)"} <= set(
                head["learner_throughput"])


@pytest.mark.slow
def test_the_learner_group_benchmark_runs() -> None:
    # One rank and a 2-rank group on HalfCheetah, a few updates each: the runs finish
    # and the record holds the group's figures (their values are the full form's job).
    proc = subprocess.run(
        [sys.executable, "-m", "bench.learner_group", "--quick", "--total-steps", "20480"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    record = json.loads((ROOT / "bench/results/learner_group-quick.json").read_text())
    runs = {r["learners"]: r for r in record["results"]["runs"]}
    assert runs[1]["ok"] and runs[2]["ok"], runs
    assert {"allreduce_seconds_per_update", "weights_identical"} <= set(runs[2])
    assert "two_ranks_within_one_rank_spread" in record["results"]["summary"]


@pytest.mark.slow
def test_the_atari_record_benchmark_runs_and_records_its_sitting(tmp_path: Path) -> None:
    # The Pong record spans sittings on 2 cores; its --quick form runs the same command
    # to 4,096 steps: the record counts the sitting, and a second call, the run being
    # finished, runs nothing more.
    pytest.importorskip("ale_py")
    import shutil

    runs = ROOT / "bench/results/runs"
    for stale in runs.glob("atari-ALE-Pong-v5-seed1-quick*"):
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "bench.atari_record", "--quick"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        record = json.loads((ROOT / "bench/results/atari_record-quick.json").read_text())
        result = record["results"]
        assert result["finished"] and result["global_step"] == 4096, result
        assert [s["exit_code"] for s in result["sittings"]] == [0], result["sittings"]
        assert result["sittings"][0]["step_at_end"] == 4096
    # What the A/B table reads: the settings the run trained with (the atari preset's)
    # and how its updates went.
    assert result["run_settings"]["preset"] == "atari"
    assert result["run_settings"]["clip_against"] == "learner"
    assert result["update_health"]["updates_logged"] > 0
    assert result["update_health"]["policy_lag_mean"] is not None


@pytest.mark.parametrize(("flags", "said"), [
    (["--tag", "x"], "give its --run-dir"),
    (["--tag", "x", "--record-only"], "give its --run-dir"),
    (["--run-dir", "D"], "give it --tag T"),
    (["--quick", "--tag", "x", "--run-dir", "D"], "drop --run-dir and --tag"),
    (["--run-dir", "D", "--tag", "ALE-Pong-v5-seed2"], "does not end in -seedN"),
    (["--run-dir", "NOT-STARTED", "--tag", "x"], "hetrl local --out"),
])
def test_the_atari_recorder_refuses_what_would_record_the_wrong_run(
        tmp_path: Path, flags: list[str], said: str) -> None:
    # Said before anything runs: a tag names a run made elsewhere, which is started by
    # hand, and no record may take another's name.
    flags = [str(tmp_path / f) if f in ("D", "NOT-STARTED") else f for f in flags]
    proc = subprocess.run([sys.executable, "-m", "bench.atari_record", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode != 0 and said in proc.stderr, proc.stderr
    assert not (tmp_path / "NOT-STARTED").exists() and not (tmp_path / "D").exists()


def test_an_atari_record_states_the_run_as_it_was_started(tmp_path: Path) -> None:
    # A resumed sitting takes every setting from the run's settings.json, so the record
    # does too, whatever the recorder's own flags say.
    from bench.atari_record import Settings, _as_saved, record

    out = tmp_path / "run"
    out.mkdir()
    (out / "settings.json").write_text(json.dumps(
        {"env": "ALE/Pong-v5", "seed": 3, "total_steps": 2048, "atari_frame_skip": 2}))
    (out / "summary.json").write_text(json.dumps({"outcome": "finished"}))
    (out / "metrics.jsonl").write_text("\n".join(json.dumps(
        {"global_step": step, "charts/mean_return_100": -21.0 + step / 128,
         "wall_seconds": step / 100}) for step in (1024, 2048)))
    s = _as_saved(Settings(run_dir=str(out), tag="t"), out)
    assert (s.seed, s.total_steps) == (3, 2048)
    result = record(s, out, [])
    assert result["seed"] == 3 and result["total_steps"] == 2048 and result["finished"]
    assert result["frames"] == 2 * 2048 and result["final_mean_score_100"] == -5.0


def test_an_atari_record_keeps_its_milestone_scores_exactly(tmp_path: Path) -> None:
    # The kept curve is thinned to about 200 points; the 500k-step scores must not move
    # with its stride.
    from bench.atari_record import Settings, record
    from bench.tables import _score_at

    out = tmp_path / "run"
    out.mkdir()
    (out / "settings.json").write_text(json.dumps(
        {"env": "ALE/Pong-v5", "seed": 3, "total_steps": 1_500_000}))
    steps = range(1000, 1_200_001, 1000)  # 1,200 rows, every 1,000 steps
    (out / "metrics.jsonl").write_text("\n".join(json.dumps(
        {"global_step": step, "charts/mean_return_100": step / 100_000,
         "wall_seconds": step / 100}) for step in steps))
    result = record(Settings(run_dir=str(out), tag="t", total_steps=1_500_000), out, [])
    assert len(result["curve"]) < 300
    assert result["score_at"] == {"500000": 5.0, "1000000": 10.0}
    assert _score_at(result, 1_000_000) == "10.0"
    assert _score_at(result, 1_500_000) == "-"  # not reached yet


def test_an_atari_record_of_another_seed_or_game_keeps_the_pong_record() -> None:
    from bench.atari_record import Settings, record_names

    def record_name(s: Settings) -> str:
        return record_names(s)[0]

    assert record_name(Settings()) == "summary_atari"
    assert record_name(Settings(seed=2)) == "summary_atari-ALE-Pong-v5-seed2"
    assert record_name(Settings(env="ALE/Breakout-v5")) == "summary_atari-ALE-Breakout-v5-seed1"
    assert record_name(Settings(seed=2, tag="x")) == "summary_atari-x"
    assert record_name(Settings(seed=2, quick=True)) == "atari_record"
    # each curve beside its record, as named before the seed records existed
    assert [record_names(s)[1] for s in (Settings(), Settings(seed=2), Settings(tag="x"),
                                         Settings(quick=True))] == [
        "atari-ALE-Pong-v5", "atari-ALE-Pong-v5-seed2", "atari-ALE-Pong-v5-x",
        "atari-ALE-Pong-v5-quick"]


def test_a_bar_counts_as_reached_only_over_a_full_window_of_episodes(tmp_path: Path) -> None:
    # bench.spaces once recorded MiniGrid at its bar from step 1,024: a mean of 2 episodes
    from bench.memory import first_reaching

    rows = [{"global_step": step, "wall_seconds": step / 1000, "charts/episodes": episodes,
             "charts/mean_return_100": mean}
            for step, episodes, mean in [(1024, 2, 0.80), (6656, 76, 0.90),
                                         (11776, 157, 0.79), (16896, 240, 0.85)]]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert first_reaching(tmp_path, 0.8) == 16896
    assert first_reaching(tmp_path, 0.9) is None


def test_a_records_commit_says_when_the_code_was_not_committed(tmp_path: Path) -> None:
    from bench.common import git_commit

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "learner").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "learner" / "ppo.py").write_text("a = 1\n")
    (tmp_path / "docs" / "page.md").write_text("text\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    commit = git_commit(tmp_path)
    assert commit and "+" not in commit
    (tmp_path / "docs" / "page.md").write_text("more text\n")  # not code
    assert git_commit(tmp_path) == commit
    (tmp_path / "learner" / "ppo.py").write_text("a = 2\n")
    assert git_commit(tmp_path) == f"{commit}+changes"


def test_the_atari_preprocessing_benchmark_rebuilds_hetrls_image() -> None:
    # docs/atari.md's claim that hetrl's Atari image is each frame's grayscale, pooled,
    # then resized rests on this rebuild matching the pipeline bit for bit.
    proc = subprocess.run(
        [sys.executable, "-m", "bench.atari_preprocess", "--quick"], cwd=ROOT,
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    record = json.loads((ROOT / "bench/results/summary_atari_preprocess-quick.json")
                        .read_text())["results"]
    assert record["hetrl vs its order in OpenCV (gray, pool, resize)"]["max_abs_diff"][
        "max"] == 0
    assert record["control: hetrl vs CleanRL a step earlier"]["max_abs_diff"]["max"] > 10


def _monitor(path: Path, games: list[tuple[float, int]]) -> None:
    lines = ['#{"t_start": 0.0, "env_id": "PongNoFrameskip-v4"}', "r,l,t"]
    lines += [f"{score},{frames},{i}.0" for i, (score, frames) in enumerate(games)]
    path.write_text("\n".join(lines) + "\n")


def test_the_atari_reference_reads_a_zoo_run_as_hetrls_record_reads_its_own(
        tmp_path: Path) -> None:
    # docs/atari.md compares hetrl's Pong curve with the zoo's at the same agent steps:
    # frames per env times the envs over the frame skip, and the mean of the last 100.
    from bench import atari_reference

    for env in range(2):  # 100 lost games of 400 frames, then 100 won
        _monitor(tmp_path / f"{env}.monitor.csv", [(-21.0, 400)] * 100 + [(21.0, 400)] * 100)
    (tmp_path / "PongNoFrameskip-v4").mkdir()
    (tmp_path / "PongNoFrameskip-v4/config.yml").write_text(
        "!!python/object/apply:collections.OrderedDict\n- - - batch_size\n    - 256\n"
        "  - - env_wrapper\n    - - stable_baselines3.common.atari_wrappers.AtariWrapper\n")
    r = atari_reference.summarize_run(tmp_path, frame_skip=4)
    assert (r["envs"], r["games"], r["global_step"], r["frames"]) == (2, 400, 40_000, 160_000)
    assert r["env_ids"] == ["PongNoFrameskip-v4"]
    # each env's k-th game ends at 2 x 400k / 4 steps: the 100 games before the first win
    # end at 20,000; a mean of 0 needs 50 wins (25 each: 25,000), 15 needs 86, 20 needs 98
    assert r["first_reached"] == {"0": 25_000, "15": 28_600, "20": 29_800}
    points = atari_reference.curve(atari_reference.read_games(tmp_path, 4)[0])
    assert atari_reference.score_at(points, 20_000) == -21.0
    assert atari_reference.score_at(points, 9_999) is None  # fewer than 100 games
    assert r["final_mean_score_100"] == 21.0
    assert r["hyperparameters"] == {
        "batch_size": "256",
        "env_wrapper": "stable_baselines3.common.atari_wrappers.AtariWrapper"}
    (tmp_path / "0.monitor.csv").write_text("r,l,t\n1,2,3\n")
    with pytest.raises(ValueError, match="not an SB3 Monitor file"):
        atari_reference.read_games(tmp_path, 4)


def test_the_sticky_action_reference_reads_each_dopamine_seed_at_the_records_steps(
        tmp_path: Path) -> None:
    # docs/atari.md's v5 reference: Dopamine lists each seed's iterations (250k agent
    # steps each) in order, and the iteration that ends at 500k steps is iteration 1.
    from bench import atari_reference

    entries = [{"Iteration": i, "Value": 100 * seed + i, "Agent": agent}
               for agent in ("DQN", "IQN") for seed in (1, 2) for i in range(10)]
    entries += [{"Iteration": i, "Value": 300.0 + i, "Agent": "DQN"} for i in range(4)]
    path = tmp_path / "pong.json"
    path.write_text(json.dumps(entries))
    r = atari_reference.summarize_dopamine(path, 2_500_000)
    assert r["game"] == "pong" and list(r["agents"]) == ["DQN", "IQN"]
    dqn = r["agents"]["DQN"]
    assert (dqn["seeds"], dqn["iterations"]) == (3, 4)  # the third seed stops at 1M steps
    assert dqn["score_at"]["500000"] == [101, 201, 301]
    assert dqn["score_at"]["1000000"] == [103, 203, 303]
    assert dqn["score_at"]["2500000"] == [109, 209]
    assert r["agents"]["IQN"]["score_at"]["2500000"] == [109, 209]
    path.write_text(json.dumps([{"step": 1}]))
    with pytest.raises(ValueError, match="not a Dopamine baselines file"):
        atari_reference.read_dopamine(path)
    path.write_text("[]")
    with pytest.raises(ValueError, match="no entries"):
        atari_reference.read_dopamine(path)
