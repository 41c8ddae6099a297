"""Benchmark 3, pipelining on one machine: training env steps/s, serial vs hetrl.

(a) serial, CleanRL-style: one process, one torch thread, the same `Collector` (N envs,
    T steps) and the same `ppo_update` (default `TrainSettings`, or --epochs and
    --minibatches on both sides), alternating
    "collect fragments_per_batch fragments" and "train on them".
(b) hetrl with one worker: the real `python -m hetrl.rollout.worker` pinned to one core and
    the real `python -m hetrl.learner.learner` pinned to the other, over loopback gRPC, so
    stepping and training overlap. Same env, N, T, seed and hyperparameters.
Steps/s is steady state: from the first update's record to the last. Learner-wait is
the learner's share of time waiting for fragments (summary.json); worker-wait is the
worker's share waiting for credits (fragment wait_seconds summed over the wall time).
The ceiling of (b)/(a) with one worker is 1 + train time / collect time of (a), shown
as "ideal". Run: `python -m bench.pipelining [--quick]`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

import numpy as np
import torch
import tyro

from bench import common, harness
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.ppo import Batch, ppo_update
from hetrl.learner.settings import LearnerSettings, TrainSettings
from hetrl.rollout.collector import Collector
from hetrl.rollout.envs import make_vector_env
from hetrl.rollout.fragments import STEP_FIELDS
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import WorkerSettings, to_json
from hetrl.rollout.transport import new_token


@dataclasses.dataclass
class Settings:
    """Serial collect/train vs hetrl's pipelined worker + learner on separate cores."""

    env: str = "Humanoid-v5"
    """Env to train on."""
    envs_per_worker: int = 8
    """N (hetrl's default)."""
    fragment_length: int = 64
    """T (hetrl's default)."""
    total_steps: int = 60_000
    """Env steps per run."""
    repeats: int = 3
    """(a)/(b) pairs."""
    placement: str = "split"
    """split: worker and learner pinned to separate cores; shared: unpinned (hetrl local)."""
    seed: int = 1
    """Seed of both."""
    epochs: int = 10
    """PPO epochs per batch, the same on both sides (CleanRL's MuJoCo setting; hetrl's
    CartPole default of 4 trains so little that pipelining cannot gain much)."""
    minibatches: int = 32
    """Minibatches per epoch, the same on both sides (CleanRL's MuJoCo setting)."""
    quick: bool = False
    """One short pair."""


def serial(s: Settings) -> dict:
    """(a): collect and train in turn in this process."""
    cfg = TrainSettings(total_steps=s.total_steps, epochs=s.epochs, minibatches=s.minibatches)
    settings = WorkerSettings(env=s.env, envs_per_worker=s.envs_per_worker,
                              fragment_length=s.fragment_length, seed=s.seed)
    torch.set_num_threads(1)
    torch.manual_seed(s.seed)
    envs = make_vector_env(settings, s.envs_per_worker, settings.vector_mode)
    policy = Policy(envs.single_observation_space, envs.single_action_space, settings)
    optimizer = PolicyAdam(policy, cfg.learning_rate)
    collector = Collector(envs, policy, s.fragment_length, s.seed)
    steps, collect_s, train_s, records = 0, 0.0, 0.0, []
    load = common.ForeignLoad([os.getpid()]).start()
    start = time.perf_counter()
    while steps < s.total_steps:
        t0 = time.perf_counter()
        frags = [collector.collect() for _ in range(cfg.batch_fragments(2))]
        t1 = time.perf_counter()
        optimizer.param_groups[0]["lr"] = max(0.0, 1 - steps / cfg.total_steps) * cfg.learning_rate

        def stack(name: str, frags=frags) -> torch.Tensor:
            return torch.from_numpy(np.concatenate([getattr(f, name) for f in frags], axis=1))

        batch = Batch(**{name: stack(name) for name in STEP_FIELDS  # recurrent-only: None
                         if getattr(frags[0], name) is not None})
        ppo_update(policy, optimizer, batch, cfg)
        t2 = time.perf_counter()
        collect_s, train_s = collect_s + t1 - t0, train_s + t2 - t1
        steps += sum(f.rewards.size for f in frags)
        records.append((steps, t2 - start))
    envs.close()
    (s0, w0), (s1, w1) = records[0], records[-1]
    return {"steps_per_s": (s1 - s0) / (w1 - w0), "collect_s": collect_s, "train_s": train_s,
            "train_fraction": train_s / (collect_s + train_s),
            "train_ms_per_update": 1e3 * train_s / len(records), "other_load_cores": load.stop()}


def pipelined(s: Settings, run: int) -> dict:
    """(b): a real worker and a real learner process, each pinned to its own core."""
    worker_cpus, learner_cpus = harness.placement(s.placement)
    token = new_token()
    out = common.RESULTS / "runs" / f"pipelining-{run}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    wsettings = WorkerSettings(env=s.env, envs_per_worker=s.envs_per_worker,
                               fragment_length=s.fragment_length, seed=s.seed)
    worker, address = harness.start_worker(wsettings, worker_cpus, token,
                                           f"pipelining-worker-{run}")
    lsettings = LearnerSettings(env=s.env, seed=s.seed, total_steps=s.total_steps,
                                epochs=s.epochs, minibatches=s.minibatches,
                                worker_addresses=(address,), out=str(out), progress=False)
    (out / "learner.json").write_text(to_json(lsettings))
    learner = harness.spawn(["-m", "hetrl.learner.learner", str(out / "learner.json")],
                            learner_cpus, f"pipelining-learner-{run}", token)
    load = common.ForeignLoad([os.getpid(), worker.pid, learner.pid]).start()
    try:
        code = learner.wait(s.total_steps / 200 + 120)
        other_load = load.stop()
    finally:
        harness.stop(learner)
        harness.stop(worker)
    if code != 0:
        raise RuntimeError(f"learner exited {code}; see {harness.LOGS}")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    first, last = records[0], records[-1]
    span = last["wall_seconds"] - first["wall_seconds"]
    per_batch = TrainSettings().batch_fragments(2)
    worker_wait = sum(r.get("charts/worker_wait_seconds", 0.0)
                      * r.get("charts/fragments_per_batch", per_batch) for r in records[1:])
    learner_busy = summary["learner_wait_seconds"] + summary["learner_train_seconds"]
    return {"steps_per_s": (last["global_step"] - first["global_step"]) / span,
            "learner_wait_fraction": summary["learner_wait_seconds"] / learner_busy,
            "worker_wait_fraction": worker_wait / span,
            "policy_lag_histogram": summary.get("policy_lag_histogram"),
            "learner_train_ms_per_update": 1e3 * summary["learner_train_seconds"] / len(records),
            "other_load_cores": other_load}


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, repeats=1, total_steps=8_000)
    if len(os.sched_getaffinity(0)) < 2:
        print("only one usable core: (b) cannot put worker and learner on separate cores")
    a_runs, b_runs, ratios = [], [], []
    for i in range(s.repeats):
        print(f"pair {i + 1}/{s.repeats} ...", flush=True)
        a = serial(s)
        b = pipelined(s, i)
        a_runs.append(a)
        b_runs.append(b)
        ratios.append(b["steps_per_s"] / a["steps_per_s"])
    summary = {
        "serial_steps_per_s": common.summarize([a["steps_per_s"] for a in a_runs]),
        "hetrl_steps_per_s": common.summarize([b["steps_per_s"] for b in b_runs]),
        "ratio": common.summarize(ratios),
        "ideal_ratio_one_worker": common.summarize(
            [1 / (1 - a["train_fraction"]) for a in a_runs]),
        "serial_train_fraction": common.summarize([a["train_fraction"] for a in a_runs]),
        "learner_wait_fraction": common.summarize([b["learner_wait_fraction"] for b in b_runs]),
        "worker_wait_fraction": common.summarize([b["worker_wait_fraction"] for b in b_runs]),
        "serial_train_ms": common.summarize([a["train_ms_per_update"] for a in a_runs]),
        "hetrl_train_ms": common.summarize([b["learner_train_ms_per_update"] for b in b_runs]),
        "other_load_a": common.summarize([a["other_load_cores"] for a in a_runs]),
        "other_load_b": common.summarize([b["other_load_cores"] for b in b_runs]),
        "target_ratio": 1.6,
    }
    common.print_table(
        f"Pipelining on {s.env} ({s.envs_per_worker} envs x {s.fragment_length} steps, "
        f"{s.epochs} epochs x {s.minibatches} minibatches, {s.total_steps:,} steps, "
        f"placement {s.placement}; "
        f"median [min-max] of {s.repeats})",
        ["figure", "value"],
        [["(a) serial collect/train, steps/s", common.fmt(summary["serial_steps_per_s"])],
         ["(b) hetrl 1 worker + learner, steps/s", common.fmt(summary["hetrl_steps_per_s"])],
         ["(b)/(a)  [target >= 1.6]", common.fmt(summary["ratio"], ".2f") + "  " +
          common.verdict(summary["ratio"]["median"], 1.6)],
         ["ideal (b)/(a) with one worker = 1/(1 - train share of (a))",
          common.fmt(summary["ideal_ratio_one_worker"], ".2f")],
         ["(a) share of time training", common.fmt(summary["serial_train_fraction"], ".3f")],
         ["(b) learner-wait fraction", common.fmt(summary["learner_wait_fraction"], ".3f")],
         ["(b) worker-wait fraction", common.fmt(summary["worker_wait_fraction"], ".3f")],
         ["(a) train ms per update", common.fmt(summary["serial_train_ms"], ".1f")],
         ["(b) learner train ms per update (incl. weights push)",
          common.fmt(summary["hetrl_train_ms"], ".1f")],
         ["other processes' load during (a) / (b), cores",
          common.fmt(summary["other_load_a"], ".2f") + " / " +
          common.fmt(summary["other_load_b"], ".2f")]])
    results = {"serial": a_runs, "hetrl": b_runs, "summary": summary}
    common.write_json("pipelining", s, results)
    return results


if __name__ == "__main__":
    main()
