"""Rows of metrics at a time-based rate: each averages the updates since the last and
leaves no episode out; a run's rows come at that rate, the last at the end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetrl.learner.rows import Rows


def test_a_row_averages_its_updates_and_keeps_every_episode() -> None:
    rows = Rows(every=2.0)
    assert not rows.due(0.0)  # nothing to write yet
    rows.add({"losses/value_loss": 1.0}, [0, 1], np.array([10.0]), np.array([10]))
    assert rows.due(0.0)  # the first update starts the first row
    first = rows.take(0.0)
    assert first["charts/episodic_return"] == 10.0 and first["charts/updates_in_row"] == 1
    rows.add({"losses/value_loss": 2.0}, [1, 1], np.array([20.0, 30.0]), np.array([2, 3]))
    assert not rows.due(1.0)
    rows.add({"losses/value_loss": 6.0, "losses/clipfrac": float("nan")}, [3],
             np.array([]), np.array([]))
    assert rows.due(2.5)
    row = rows.take(2.5)
    assert row["losses/value_loss"] == 4.0 and "losses/clipfrac" not in row
    assert row["charts/episodic_return"] == 25.0 and row["charts/episodes_in_row"] == 2
    assert row["charts/policy_lag"] == pytest.approx(5 / 3) and row["charts/policy_lag_max"] == 3
    assert row["charts/fragments_per_batch"] == 1.5 and row["charts/updates_in_row"] == 2


def test_every_zero_writes_a_row_per_update() -> None:
    rows = Rows(every=0.0)
    rows.add({}, [0], np.array([]), np.array([]))
    assert rows.due(0.0)
    rows.take(0.0)
    rows.add({}, [0], np.array([]), np.array([]))
    assert rows.due(0.0)


@pytest.mark.slow
@pytest.mark.lowest
def test_a_runs_rows_come_at_its_rate_and_count_every_episode(tmp_path: Path) -> None:
    from hetrl.launch import run_local

    result = run_local(env="CartPole-v1", workers=2, envs_per_worker=8,
                       total_steps=60_000, metrics_every=1.0, out=str(tmp_path / "r"),
                       progress=False, report=False)
    assert result.ok
    rows = [json.loads(line) for line in (result.out / "metrics.jsonl").read_text().splitlines()]
    updates = sum(r["charts/updates_in_row"] for r in rows)
    walls = [r["wall_seconds"] for r in rows]
    assert len(rows) < updates  # fewer rows than updates
    assert all(b - a >= 0.9 for a, b in zip(walls[:-2], walls[1:-1], strict=True))
    assert rows[-1]["global_step"] == result.summary["global_step"]  # the last, at the end
    # Every episode of every trained batch is in a row (a batch assembled as the budget
    # ran out is counted in the summary but never trained).
    in_rows = sum(r.get("charts/episodes_in_row", 0) for r in rows)
    assert 0.95 * result.summary["episodes"] <= in_rows <= result.summary["episodes"]
