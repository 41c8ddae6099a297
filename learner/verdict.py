"""Say what bounds a run, from the time the learner waited for data and the time the
workers waited for credits, in the words a user acts on.

Pure arithmetic on totals that the learner keeps; no I/O. The thresholds are the usual
reading of utilisation graphs: a learner idle for most of the run is starved of
experience (add env hosts), workers idle at their credit limit mean the learner is the
bottleneck (bigger GPU, larger batch, fewer epochs).
"""

from __future__ import annotations

import dataclasses
import math

EXPERIENCE_BOUND_WAIT = 0.5  # learner waited for data this fraction of its time
LEARNER_BOUND_WAIT = 0.3  # workers waited for credits this fraction of their time


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What bounds the run, and how many more workers would saturate the learner."""

    kind: str  # "experience-bound", "learner-bound" or "balanced"
    text: str
    learner_wait_fraction: float
    worker_wait_fraction: float
    more_workers: int = 0


def judge(
    learner_wait_seconds: float,
    learner_train_seconds: float,
    worker_collect_seconds: float,
    worker_wait_seconds: float,
    workers: int,
    env_hosts: int = 1,
) -> Verdict:
    """Judge a run from its totals (seconds summed over the run; workers summed too)."""
    learner_total = learner_wait_seconds + learner_train_seconds
    worker_total = worker_collect_seconds + worker_wait_seconds
    lw = learner_wait_seconds / learner_total if learner_total > 0 else 0.0
    ww = worker_wait_seconds / worker_total if worker_total > 0 else 0.0
    if lw >= EXPERIENCE_BOUND_WAIT and lw >= ww:
        # The learner could absorb 1 / (1 - lw) times the experience it got.
        factor = 1.0 / max(1.0 - lw, 0.05)
        more = max(1, math.ceil(workers * (factor - 1.0)))
        per_host = max(1, workers // max(env_hosts, 1))
        hosts = math.ceil(more / per_host)
        text = (f"learner waited for data {lw:.0%} of the time: experience-bound; add env "
                f"workers (about {more} more, i.e. {hosts} more env host"
                f"{'s' if hosts != 1 else ''} of this size)")
        return Verdict("experience-bound", text, lw, ww, more)
    if ww >= LEARNER_BOUND_WAIT:
        text = (f"workers waited for credits {ww:.0%} of the time: learner-bound; a faster "
                "learner (bigger GPU), fewer epochs or larger minibatches help, more env "
                "hosts do not")
        return Verdict("learner-bound", text, lw, ww)
    text = (f"balanced: learner waited {lw:.0%}, workers waited {ww:.0%}; both sides are "
            "busy, so scale them together")
    return Verdict("balanced", text, lw, ww)
