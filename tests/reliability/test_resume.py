"""Fault 5 from the user's side: a run resumed with --resume (after a stop or a kill)
reports the whole run, not just its last part: summary, metrics and report are
cumulative and true across resumes. Real `hetrl local` runs."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import hetrl

FRAGMENT_STEPS = 4 * 32  # --envs-per-worker 4 x --fragment-length 32


def run(out: Path, total: int, *extra: str) -> dict:
    proc = hetrl("local", "--out", str(out), "--workers", "1", "--envs-per-worker", "4",
                 "--fragment-length", "32", "--total-steps", str(total), "--no-progress",
                 *extra)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, output[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_a_resumed_run_reports_the_whole_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = run(out, 4000)
    second = run(out, 8000, "--resume")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    resumed_at = next(i for i, r in enumerate(records) if r["global_step"] > first["global_step"])
    sps_first = sorted(r["charts/SPS"] for r in records[:resumed_at])[resumed_at // 2]
    sps_after = records[resumed_at]["charts/SPS"]
    report = (out / "report" / "report.md").read_text()
    reported = float(report.split("| env steps / s | ")[1].split(" |")[0].replace(",", ""))
    print(f"\nresume: episodes {first['episodes']} -> {second['episodes']}, wall "
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
