"""The learner's half of periodic evaluation: policy snapshots out, results in.

Every `--eval-every` env steps the learner drops a snapshot of its policy (safetensors,
with the settings `load_policy` needs) into <out>/eval; a separate evaluator process
(hetrl.rollout.evaluate, started by the launcher) plays it on spare CPU and appends the
returns to eval/results.jsonl, which this object forwards to the run's metrics as
charts/eval_return. Training never waits for an evaluation: a snapshot costs one copy of
the weights, and results are read when they are there.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from safetensors.numpy import save_file

from hetrl.learner.metrics import MetricsWriter
from hetrl.rollout.evaluate import model_metadata
from hetrl.rollout.policy import policy_arrays
from hetrl.rollout.settings import RESULTS_FILE, SNAPSHOT_GLOB

log = logging.getLogger("hetrl.learner")


class PeriodicEval:
    """Snapshots on schedule, results forwarded to the metrics."""

    def __init__(self, out: Path, every: int, settings: object) -> None:
        self.folder = out / "eval"
        self.every, self.settings = every, settings
        self.next_step = every
        self._read = 0  # bytes of results.jsonl already forwarded
        if every:
            self.folder.mkdir(parents=True, exist_ok=True)

    def after_update(self, policy, global_step: int, metrics: MetricsWriter) -> None:
        if not self.every:
            return
        if global_step >= self.next_step:
            self._snapshot(policy, global_step)
            self.next_step = (global_step // self.every + 1) * self.every
        self.forward(metrics)

    def final(self, policy, global_step: int) -> None:
        """A snapshot of the final policy (the launcher waits for its evaluation)."""
        if self.every:
            self._snapshot(policy, global_step)

    def _snapshot(self, policy, global_step: int) -> None:
        name = SNAPSHOT_GLOB.replace("*", f"{global_step:012d}")
        tmp = self.folder / (name + ".tmp")
        try:
            save_file(policy_arrays(policy), str(tmp), metadata={
                **model_metadata(self.settings), "global_step": str(global_step)})
            tmp.replace(self.folder / name)
        except OSError as exc:  # evaluation is a nicety; training goes on
            tmp.unlink(missing_ok=True)
            log.warning("could not write an evaluation snapshot: %s", exc)

    def forward(self, metrics: MetricsWriter) -> None:
        """Log the evaluations finished since the last call."""
        path = self.folder / RESULTS_FILE
        if not self.every or not path.exists():
            return
        with path.open("rb") as f:
            f.seek(self._read)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line being written waits for next time
        self._read += len(complete)
        for line in complete.decode().splitlines():
            record = json.loads(line)
            metrics.log(record["global_step"], {
                "charts/eval_return": record["eval_return"],
                "charts/eval_return_std": record["eval_return_std"],
                "charts/eval_length": record["eval_length"],
            })
