"""The evaluator process beside a learner (`--eval-every`), the same for a local run and
a cluster job's learner host: started with the run, never supervised as a worker (an
evaluation that fails costs a chart, not the run), and given a bounded time at the end
to play the learner's final snapshot so that the report shows how the final policy does.
"""

from __future__ import annotations

import time
from pathlib import Path

from hetrl.launch.processes import Child, spawn
from hetrl.rollout.settings import SNAPSHOT_GLOB, EvaluatorSettings


def start_evaluator(out: Path, episodes: int, seed: int, run_dir: Path,
                    env: dict[str, str], new_session: bool = False,
                    deterministic: bool = True) -> Child:
    """Start the evaluator on the snapshots the learner leaves in <out>/eval (in a
    session of its own with `new_session`: see launch.processes.spawn)."""
    settings = EvaluatorSettings(eval_dir=str(out / "eval"), eval_episodes=episodes, seed=seed,
                                 deterministic=deterministic)
    return spawn("evaluator", "hetrl.rollout.evaluate", settings, run_dir, env,
                 new_session=new_session)


def finish_evaluations(evaluator: Child, out: Path, timeout: float) -> None:
    """Wait up to `timeout` s for the evaluator to play the snapshots left in <out>/eval
    (the caller stops it afterwards, like every child)."""
    deadline = time.monotonic() + timeout
    while (time.monotonic() < deadline and evaluator.exit_code() is None
           and any((out / "eval").glob(SNAPSHOT_GLOB))):
        time.sleep(0.1)
