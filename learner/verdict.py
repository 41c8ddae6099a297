"""Say what bounds a run, from the time the learner waited for data and the time the
workers waited for credits, in the words a user acts on.

Pure arithmetic on totals that the learner keeps; no I/O. The thresholds are the usual
reading of utilisation graphs: a learner idle for most of the run is starved of
experience (add env hosts), workers idle at their credit limit mean the learner is the
bottleneck (bigger GPU, larger batch, fewer epochs). Time in which no worker sent
anything at all (a stall: hung envs, frozen hosts) is not a shortage of workers: it is
taken out of the learner's wait before judging, and named.
"""

from __future__ import annotations

import dataclasses
import math

EXPERIENCE_BOUND_WAIT = 0.5  # learner waited for data this fraction of its time
LEARNER_BOUND_WAIT = 0.3  # workers waited for credits this fraction of their time
STALLED = 0.5  # every worker silent this fraction of the learner's time
LOCKSTEP_WASTE = 0.2  # a learner group's rank waited for the others this share of its time
SYNCHRONOUS_NOTE = ("--synchronous: the learner and the workers take turns, so each waits "
                    "while the other works; without it they overlap, at a policy lag of 1 "
                    "or more")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What bounds the run, and how many more workers would saturate the learner."""

    kind: str  # "experience-bound", "learner-bound", "balanced" or "stalled"
    text: str
    learner_wait_fraction: float
    worker_wait_fraction: float
    more_workers: int = 0
    stalled_seconds: float = 0.0


def judge(
    learner_wait_seconds: float,
    learner_train_seconds: float,
    worker_collect_seconds: float,
    worker_wait_seconds: float,
    workers: int,
    env_hosts: int = 1,
    stalled_seconds: float = 0.0,
    env_steps: int = 0,
    synchronous: bool = False,
) -> Verdict:
    """Judge a run from its totals (seconds summed over the run; workers summed too).
    `stalled_seconds` of the learner's wait had no worker sending anything; `env_steps`
    collected in `worker_collect_seconds` give the env's measured step cost; a
    `synchronous` run's waits are its design, and the verdict says so."""
    stall = min(max(stalled_seconds, 0.0), learner_wait_seconds)
    learner_waited = _share(learner_wait_seconds - stall, learner_train_seconds)
    workers_waited = _share(worker_wait_seconds, worker_collect_seconds)
    verdict = _judge(learner_waited, workers_waited, workers, env_hosts)
    if synchronous:
        verdict = dataclasses.replace(verdict, text=f"{verdict.text}; {SYNCHRONOUS_NOTE}")
    if verdict.kind == "experience-bound" and env_steps and worker_collect_seconds > 0:
        per_step = worker_collect_seconds / env_steps
        verdict = dataclasses.replace(verdict, text=(
            f"{verdict.text}; the envs bound it: a worker makes {1 / per_step:,.0f} env "
            f"steps/s ({per_step * 1e3:.2f} ms of a worker's time per env step)"))
    if stall <= 0:
        return verdict
    total = learner_wait_seconds + learner_train_seconds
    note = (f"every worker stalled for {stall:.0f} s ({stall / total:.0%} of the learner's "
            "time: no fragment from any of them, a hang or a freeze that more workers "
            "would not fix)")
    if stall >= STALLED * total:
        return dataclasses.replace(verdict, kind="stalled", stalled_seconds=stall,
                                   text=f"{note}; the rest of the time: {verdict.text}")
    return dataclasses.replace(verdict, stalled_seconds=stall, text=f"{verdict.text}; {note}")


def lockstep_note(lockstep_shares: list[float], rank_workers: list[int]) -> str | None:
    """What a learner group lost to lockstep, when some rank spent LOCKSTEP_WASTE or more
    of its time waiting in the turn for slower ranks: which rank held the group back
    (the one that waited least in the turns: the others waited for it) and what evens
    it out; None when the ranks kept pace."""
    if len(lockstep_shares) < 2 or max(lockstep_shares) < LOCKSTEP_WASTE:
        return None
    waiting = max(range(len(lockstep_shares)), key=lambda r: lockstep_shares[r])
    slow = min(range(len(lockstep_shares)), key=lambda r: lockstep_shares[r])
    return (f"lockstep cost: rank {waiting} waited {lockstep_shares[waiting]:.0%} of its time "
            f"for slower ranks, most for rank {slow} ({rank_workers[slow]} workers, the last "
            "to its turns); even out the workers per rank (hosts of one speed, workers a "
            "multiple of the ranks) or train on fewer ranks")


def _share(waited: float, busy: float) -> float:
    """The share of the time spent waiting (0 when no time was spent)."""
    return waited / (waited + busy) if waited + busy > 0 else 0.0


def _judge(lw: float, ww: float, workers: int, env_hosts: int) -> Verdict:
    """The verdict from the learner's (lw) and the workers' (ww) shares of time waited."""
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
