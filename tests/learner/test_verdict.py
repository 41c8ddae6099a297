"""The bottleneck verdict (learner.verdict.judge) from a run's wait and train totals."""

from __future__ import annotations

from hetrl.learner.verdict import judge, lockstep_note


def test_judge_reads_the_wait_fractions() -> None:
    starved = judge(learner_wait_seconds=62, learner_train_seconds=38, worker_collect_seconds=95,
                    worker_wait_seconds=5, workers=4, env_hosts=2)
    assert starved.kind == "experience-bound" and "62%" in starved.text
    assert starved.more_workers == 7  # 4 workers gave 38% of what the learner can take
    bound = judge(5, 95, 60, 40, workers=4)
    assert bound.kind == "learner-bound" and "40%" in bound.text
    assert judge(10, 90, 90, 10, workers=2).kind == "balanced"


def test_a_synchronous_run_is_told_its_waits_are_by_design() -> None:
    turns = judge(60, 40, 70, 30, workers=2, synchronous=True)
    assert turns.kind == "experience-bound" and "take turns" in turns.text
    assert "take turns" not in judge(60, 40, 70, 30, workers=2).text


def test_a_stall_is_not_a_shortage() -> None:
    # 30 s of the learner's 40 s waiting were a stall (no worker sent anything): the old
    # verdict read 75% wait as "experience-bound; add workers".
    stalled = judge(32, 8, 20, 1, workers=2, stalled_seconds=30)
    assert stalled.kind == "stalled" and "stalled for 30 s" in stalled.text
    assert stalled.more_workers == 0  # the 2 s of real waiting say balanced
    assert judge(32, 8, 20, 1, workers=2).kind == "experience-bound"
    short = judge(30, 20, 20, 1, workers=2, stalled_seconds=5)  # a short stall, noted
    assert short.kind == "experience-bound" and "stalled for 5 s" in short.text


def test_a_learner_group_that_waits_on_a_slow_rank_says_which_and_what_evens_it_out() -> None:
    note = lockstep_note([0.35, 0.02, 0.30], [3, 1, 3])
    assert note is not None
    assert note.startswith("lockstep cost: rank 0 waited 35% of its time for slower ranks")
    assert "most for rank 1 (1 workers" in note and "even out the workers per rank" in note
    assert lockstep_note([0.1, 0.05], [2, 2]) is None  # the ranks kept pace
    assert lockstep_note([0.9], [2]) is None  # one rank: no lockstep
