"""Fault 5 from the user's side: a run resumed with --resume (after a stop or a kill)
reports the whole run, not just its last part: summary, metrics and report are
cumulative and true across resumes. Real `hetrl local` runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import hetrl

FRAGMENT_STEPS = 4 * 32  # --envs-per-worker 4 x --fragment-length 32


def run(out: Path, total: int, *extra: str) -> dict:
    proc = hetrl("local", "--out", str(out), "--workers", "1", "--envs-per-worker", "4",
                 "--fragment-length", "32", "--total-steps", str(total), "--no-progress",
                 *extra)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, output[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_a_resumed_run_reports_the_whole_run(measured, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = run(out, 4000)
    second = run(out, 8000, "--resume")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    resumed_at = next(i for i, r in enumerate(records) if r["global_step"] > first["global_step"])
    sps_first = sorted(r["charts/SPS"] for r in records[:resumed_at])[resumed_at // 2]
    sps_after = records[resumed_at]["charts/SPS"]
    report = (out / "report" / "report.md").read_text()
    reported = float(report.split("| env steps / s | ")[1].split(" |")[0].replace(",", ""))
    measured(f"resume: episodes {first['episodes']} -> {second['episodes']}, wall "
          f"{first['wall_seconds']} -> {second['wall_seconds']} s, fragments_received "
          f"{first['fragments_received']} -> {second['fragments_received']} for "
          f"{second['global_step'] // FRAGMENT_STEPS} fragments of steps; first SPS after "
          f"resume {sps_after:,.0f} (median before {sps_first:,.0f}); report "
          f"{reported:,.0f} env steps/s for {second['global_step'] / second['wall_seconds']:,.0f}")
    assert second["runs"] == 2 and first["runs"] == 1
    assert second["global_step"] >= 8000
    assert second["episodes"] > first["episodes"]
    assert second["wall_seconds"] > first["wall_seconds"] + second["wall_seconds_this_run"] - 1
    for summary in (first, second):  # every fragment trained on was received and counted
        steps = summary["fragments_received"] * FRAGMENT_STEPS
        assert summary["global_step"] <= steps <= summary["global_step"] + 4 * FRAGMENT_STEPS
    assert sum(second["policy_lag_histogram"].values()) >= second["global_step"] // FRAGMENT_STEPS
    assert sps_after < 3 * sps_first  # was global_step / this run's seconds: 938,739 SPS
    walls = [r["wall_seconds"] for r in records]
    assert walls == sorted(walls)  # metrics.jsonl's clock goes on across the resume
    assert abs(reported - second["global_step"] / second["wall_seconds"]) < 2


@pytest.mark.slow
def test_after_a_killed_learner_a_resume_writes_no_step_twice(tmp_path: Path) -> None:
    """The learner killed after its last periodic checkpoint: the rows it wrote since are
    cut on --resume, so metrics.jsonl counts every step once, and the message that the
    learner died names the signal (there are no lines of it to point at)."""
    import os
    import signal

    from tests.helpers import processes_mentioning, wait_for

    out = tmp_path / "run"
    proc = hetrl("local", "--out", str(out), "--workers", "1", "--envs-per-worker", "4",
                 "--fragment-length", "32", "--total-steps", "100000000", "--no-progress",
                 "--checkpoint-every", "2")
    checkpoints = out / "checkpoints"
    wait_for(lambda: checkpoints.exists() and any(checkpoints.glob("ckpt-*.pt")), 120,
             "a periodic checkpoint")
    metrics = out / "metrics.jsonl"
    at = metrics.read_text().count("\n")
    wait_for(lambda: metrics.read_text().count("\n") > at + 20, 60, "rows past the checkpoint")
    [learner] = processes_mentioning(str(out / "launch" / "learner.json"))
    os.kill(learner, signal.SIGKILL)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "the learner was killed by SIGKILL" in output, output[-2000:]
    rows_before = [json.loads(line)["global_step"] for line in metrics.read_text().splitlines()]
    second = run(out, max(rows_before) + 2000, "--resume")
    steps = [json.loads(line)["global_step"] for line in metrics.read_text().splitlines()]
    # Rows of the dead run past its checkpoint would go back in steps after it.
    assert steps == sorted(steps), steps
    assert steps[-1] == second["global_step"]
    assert any(s > max(rows_before) for s in steps)  # it went on past where it died
