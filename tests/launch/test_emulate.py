"""An emulated heterogeneous job: every host is a real `python -m hetrl.launch.host` process
with its own SageMaker tree and loopback address, exactly as a real host would run."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from hetrl.launch.emulate import EmulateSettings, collect_result, run_emulated, start_hosts
from hetrl.launch.processes import stop_all
from tests.helpers import hetrl, wait_for


def learner_progress(cluster_root: Path, learner: str) -> int:
    metrics = cluster_root / "hosts" / learner / "model" / "metrics.jsonl"
    if not metrics.exists():
        return 0
    lines = metrics.read_text().splitlines()
    return json.loads(lines[-1])["global_step"] if lines else 0


@pytest.mark.slow
def test_emulated_cluster_solves_cartpole(tmp_path: Path) -> None:
    out = tmp_path / "c"
    proc = hetrl("emulate", "--env-hosts", "2", "--env", "CartPole-v1", "--total-steps",
                 "300000", "--seed", "1", "--out", str(out))
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    # one stream with every host's lines, each prefixed as in CloudWatch
    for prefix in ("[algo-1 env-host] ", "[algo-3 worker-1] ", "[algo-2 learner] "):
        assert prefix in output, prefix
    model = out / "hosts" / "algo-2" / "model"
    summary = json.loads((model / "summary.json").read_text())
    # Solved as bench.solve counts it: the mean of the last 100 episodes reaches 475
    # within the 300k steps, and is still there at the end.
    returns = [json.loads(line).get("charts/mean_return_100", 0.0)
               for line in (model / "metrics.jsonl").read_text().splitlines()]
    assert max(returns) >= 475, (max(returns), summary)
    assert summary["mean_return_100"] >= 475, summary
    assert len(summary["workers"]) == 4  # 2 env hosts x 2 workers
    assert {w.rsplit(":", 1)[0] for w in summary["workers"]} == {"127.0.0.1", "127.0.0.3"}
    assert (out / "hosts" / "algo-2" / "model" / "model.safetensors").exists()
    for host in ("algo-1", "algo-3"):
        assert not (out / "hosts" / host / "output" / "failure").exists()


@pytest.mark.slow
def test_killed_learner_host_ends_every_env_host(measured, tmp_path: Path) -> None:
    settings = EmulateSettings(env_hosts=2, total_steps=100_000_000, loss_timeout=4.0,
                               out=str(tmp_path / "k"), progress=False)
    cluster = start_hosts(settings)
    try:
        wait_for(lambda: learner_progress(cluster.root, cluster.learner) > 0, 120,
                 "the learner to train")
        killed_at = time.monotonic()
        cluster.hosts[cluster.learner].process.send_signal(signal.SIGKILL)
        env_children = [cluster.hosts[h] for h in cluster.env_hosts]
        wait_for(lambda: all(c.exit_code() is not None for c in env_children), 60,
                 "env hosts to exit")
        elapsed = time.monotonic() - killed_at
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    result = collect_result(cluster)
    for host in cluster.env_hosts:
        assert result.exit_codes[host] == 1
        assert "learner gone for" in result.failures[host]
    # Detected within the loss timeout plus the supervisor's 0.5 s poll and shutdown.
    assert elapsed < settings.loss_timeout + 10, elapsed
    measured(f"env hosts exited {elapsed:.1f} s after the learner host was killed "
          f"(loss_timeout {settings.loss_timeout} s)")


@pytest.mark.slow
def test_sigterm_everywhere_checkpoints_and_a_new_run_resumes(measured, tmp_path: Path
                                                              ) -> None:
    settings = EmulateSettings(env_hosts=1, workers_per_env_host=2, total_steps=100_000_000,
                               stop_budget=30.0, out=str(tmp_path / "t"), progress=False)
    cluster = start_hosts(settings)
    try:
        wait_for(lambda: learner_progress(cluster.root, cluster.learner) > 20_000, 120,
                 "the learner to train")
        start = time.monotonic()
        for child in cluster.hosts.values():  # what a job stop or spot interruption does
            child.process.send_signal(signal.SIGTERM)
        wait_for(lambda: all(c.exit_code() is not None for c in cluster.hosts.values()),
                 settings.stop_budget, "every host to exit within the stop budget")
        elapsed = time.monotonic() - start
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    result = collect_result(cluster)
    assert set(result.exit_codes.values()) == {0}, (result.exit_codes, result.failures)
    checkpoints = list((cluster.root / "hosts" / cluster.learner / "checkpoints").glob("ckpt-*"))
    assert checkpoints
    stopped_at = json.loads(
        (cluster.root / "hosts" / cluster.learner / "model" / "summary.json").read_text()
    )["global_step"]
    measured(f"all hosts exited {elapsed:.1f} s after SIGTERM; checkpoint at step {stopped_at}")

    # The restarted job (same trees, as a spot restart keeps the checkpoint dir) resumes.
    again = run_emulated(EmulateSettings(env_hosts=1, total_steps=stopped_at + 4096,
                                         out=str(tmp_path / "t"), progress=False))
    assert again.exit_code == 0, (again.exit_codes, again.failures)
    assert again.summary["resumed_from"]
    assert stopped_at < again.summary["global_step"] <= stopped_at + 4096 + 2048


def test_an_emulated_job_evaluates_on_its_learner_host(tmp_path: Path) -> None:
    """--eval-every in a cluster job: the learner host runs the evaluator, plays the final
    policy before it stops, and the job's report shows the evaluation."""
    settings = EmulateSettings(env_hosts=1, workers_per_env_host=1, envs_per_worker=4,
                               fragment_length=32, total_steps=6144, eval_every=2048,
                               eval_episodes=2, out=str(tmp_path / "e"), progress=False)
    result = run_emulated(settings)
    assert result.exit_code == 0, result.failures
    model = tmp_path / "e" / "hosts" / result.learner_host / "model"
    evals = [json.loads(line) for line in
             (model / "eval" / "results.jsonl").read_text().splitlines()]
    assert evals and evals[-1]["global_step"] >= 6144, evals  # the final policy too
    assert all(e["episodes"] == 2 for e in evals)
    assert "evaluation return at the end (deterministic)" in (
        model / "report" / "report.md").read_text()


@pytest.mark.slow
def test_an_emulated_job_runs_central_inference(tmp_path: Path) -> None:
    """--inference central reaches every host as a job hyperparameter: env hosts run env
    servers (no policy), the learner host chooses the actions and trains."""
    out = tmp_path / "c"
    proc = hetrl("emulate", "--env-hosts", "1", "--env", "CartPole-v1", "--total-steps",
                 "20000", "--envs-per-worker", "8", "--fragment-length", "32",
                 "--inference", "central", "--out", str(out))
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    assert "env steps sent over" in output  # an env server's last line, on the env host
    summary = json.loads((out / "hosts" / "algo-2" / "model" / "summary.json").read_text())
    assert summary["inference"] == "central" and summary["global_step"] >= 20_000
    assert set(summary["policy_lag_histogram"]) <= {"0", "1"}, summary
    assert summary["env_steps_malformed"] == 0


@pytest.mark.slow
def test_the_learner_hosts_own_workers_are_restarted_like_every_hosts(measured, tmp_path: Path
                                                                     ) -> None:
    """Workers on the learner host follow the same restart rules as an env host's: a
    leaky simulator that ends its worker every ~1,000 env steps does not end the job."""
    out = tmp_path / "leaky"
    proc = hetrl("emulate", "--env-hosts", "1", "--workers-per-env-host", "1",
                 "--learner-host-workers", "1", "--env", "tests.reliability.envs:DiesEvery",
                 "--envs-per-worker", "2", "--fragment-length", "32", "--total-steps", "20000",
                 "--out", str(out), env={"HETRL_TEST_DIE_AFTER": "1000"})
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-4000:]
    learner_lines = [line for line in output.splitlines() if line.startswith("[algo-2")]
    assert any("local-worker-0 exited with code 9" in line and "restarting it" in line
               for line in learner_lines), "\n".join(learner_lines[-30:])
    restarts = sum("local-worker-0 exited" in line and "restarting it" in line
                   for line in learner_lines)
    measured(f"the learner host's own worker died {restarts} times in 20,000 steps and was "
             "restarted each time; the job finished (exit 0)")
