"""A learner group's faults on a real `hetrl local --learners 2` run: a rank SIGKILLed
ends the group cleanly (rank 0 saves its model and a checkpoint, every worker stops,
exit 1 with the cause) and `--resume` continues the whole group from that checkpoint;
when rank 0 itself dies, the survivors rescue the last whole update into
checkpoints/rescue-rank<N>/ and `--resume` continues from there; a SIGTERM stops every
rank with a checkpoint and exit 0."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from hetrl.launch.emulate import EmulateSettings, collect_result, start_hosts
from hetrl.launch.processes import stop_all
from tests.helpers import processes_mentioning, wait_for
from tests.reliability.test_process_faults import start, step

# Each is a whole learner group run, killed and resumed: 8 to 22 s beside a busy machine.
pytestmark = pytest.mark.slow


def rank_pid(out: Path, rank: int) -> int:
    name = "learner" if rank == 0 else f"learner-rank{rank}"
    pids = processes_mentioning(str(out / "launch" / f"{name}.json"))
    assert len(pids) == 1, pids
    return pids[0]


def test_a_killed_rank_ends_the_group_and_resume_continues_it(measured, tmp_path: Path
                                                              ) -> None:
    out = tmp_path / "run"
    proc, log = start(out, "--env", "CartPole-v1", "--learners", "2", "--workers", "2",
                      "--envs-per-worker", "4", "--total-steps", "100000000",
                      "--checkpoint-every", "2", "--no-report")
    try:
        wait_for(lambda: step(out) > 0 and any((out / "checkpoints").glob("ckpt-*.pt")),
                 180, "training and a first checkpoint")
        os.kill(rank_pid(out, 1), signal.SIGKILL)
        killed = time.monotonic()
        code = proc.wait(120)
        ended = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 1, text[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"].startswith("failed: the learner group broke"), summary["outcome"]
    assert "another rank died or stopped answering" in summary["outcome"]
    assert "learner rank 1 (learner-rank1) was killed by SIGKILL" in text
    assert summary["workers_not_stopped"] == []
    assert processes_mentioning(str(out)) == []  # no rank or worker left behind
    stopped_at = summary["global_step"]
    newest = max((out / "checkpoints").glob("ckpt-*.pt"))
    assert torch.load(newest, weights_only=True)["global_step"] == stopped_at

    more = stopped_at + 20_000
    proc, log = start(out, "--resume", "--total-steps", str(more))
    assert proc.wait(300) == 0, log.read_text()[-3000:]
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["outcome"] == "finished" and resumed["runs"] == 2
    assert more <= resumed["global_step"] <= more + 4 * 4 * 64
    assert resumed["learner_group"]["weights_identical"], resumed["learner_group"]
    measured(f"a SIGKILLed learner rank ended the group in {ended:.1f} s (exit 1, rank 0's "
             f"checkpoint at step {stopped_at:,}); --resume continued both ranks to "
             f"{resumed['global_step']:,} with identical weights")


def test_when_rank_0_dies_the_survivors_checkpoint_and_resume_uses_it(measured, tmp_path: Path
                                                                      ) -> None:
    # Periodic checkpoints far apart: without the rescue, a resume would start over.
    out = tmp_path / "run"
    proc, log = start(out, "--env", "CartPole-v1", "--learners", "2", "--workers", "2",
                      "--envs-per-worker", "4", "--total-steps", "100000000",
                      "--checkpoint-every", "3600", "--no-report")
    try:
        wait_for(lambda: step(out) >= 10_000, 180, "training")
        os.kill(rank_pid(out, 0), signal.SIGKILL)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 1, text[-3000:]
    assert "learner rank 0 (learner) was killed by SIGKILL" in text
    assert processes_mentioning(str(out)) == []
    assert not list((out / "checkpoints").glob("ckpt-*.pt"))
    rescued = list((out / "checkpoints" / "rescue-rank1").glob("ckpt-*.pt"))
    assert len(rescued) == 1, text[-3000:]
    state = torch.load(rescued[0], weights_only=True)
    rank1 = json.loads((out / "ranks" / "rank1" / "summary.json").read_text())
    assert rank1["outcome"].startswith("failed: the learner group broke"), rank1["outcome"]
    assert state["global_step"] == rank1["global_step"] >= 10_000
    assert state["policy_version"] == rank1["policy_version"]

    more = state["global_step"] + 20_000
    proc, log = start(out, "--resume", "--total-steps", str(more))
    assert proc.wait(300) == 0, log.read_text()[-3000:]
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["outcome"] == "finished", resumed["outcome"]
    assert "rescue-rank1" in resumed["resumed_from"], resumed["resumed_from"]
    assert more <= resumed["global_step"] <= more + 4 * 4 * 64
    assert resumed["learner_group"]["weights_identical"], resumed["learner_group"]
    measured(f"rank 0 SIGKILLed at step {state['global_step']:,} with no periodic checkpoint: "
             f"rank 1 rescued version {state['policy_version']} into rescue-rank1/; --resume "
             f"continued both ranks from it to {resumed['global_step']:,}")


def test_sigterm_stops_every_rank_with_a_checkpoint(measured, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc, log = start(out, "--env", "CartPole-v1", "--learners", "2", "--workers", "2",
                      "--envs-per-worker", "4", "--total-steps", "100000000", "--no-report")
    try:
        wait_for(lambda: step(out) > 0, 180, "training to start")
        os.killpg(proc.pid, signal.SIGTERM)
        sent = time.monotonic()
        code = proc.wait(120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0, log.read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "stopped: signal SIGTERM"
    assert summary["learner_group"]["weights_identical"]
    rank1 = json.loads((out / "ranks" / "rank1" / "summary.json").read_text())
    assert rank1["outcome"] == "stopped: signal SIGTERM"
    assert any((out / "checkpoints").glob("ckpt-*.pt"))
    assert processes_mentioning(str(out)) == []
    measured(f"SIGTERM stopped both learner ranks in {took:.1f} s with a checkpoint (exit 0)")


def test_sigterm_to_one_learner_host_stops_the_whole_group(measured, tmp_path: Path) -> None:
    settings = EmulateSettings(env="CartPole-v1", env_hosts=1, learner_count=2,
                               total_steps=100_000_000, out=str(tmp_path / "e"),
                               progress=False)
    cluster = start_hosts(settings)
    try:
        metrics = cluster.root / "hosts" / "algo-2" / "model" / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and metrics.read_text().strip(), 180,
                 "the group to train")
        cluster.hosts["algo-3"].process.send_signal(signal.SIGTERM)  # rank 1's host only
        sent = time.monotonic()
        wait_for(lambda: all(c.exit_code() is not None for c in cluster.hosts.values()),
                 settings.stop_budget, "every host to exit within the stop budget")
        took = time.monotonic() - sent
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    result = collect_result(cluster)
    assert set(result.exit_codes.values()) == {0}, (result.exit_codes, result.failures)
    summary = result.summary
    assert summary["outcome"] == "stopped: learner rank 1: signal SIGTERM", summary["outcome"]
    assert any((cluster.root / "hosts" / "algo-2" / "checkpoints").glob("ckpt-*.pt"))
    measured(f"SIGTERM to rank 1's learner host alone stopped the whole emulated job in "
             f"{took:.1f} s, every host exit 0, rank 0's checkpoint written")
