"""Benchmark 6, scaling model: predict env steps/s for k env hosts x w workers, and check it.

Measured here, in this invocation, for one env:
  r  streamed env steps/s of one worker on one core (a real worker + the consumer, as
     in bench.overhead, pinned apart), and its bytes per env step;
  L  learner samples/s (hetrl's learner step on CPU with default TrainSettings and one
     torch thread, as in bench.learner_throughput).
Model, cluster (each env host has at least w cores, the learner its own host):
  X(k, w) = min(k * w * r, L, k * NIC / bytes_per_step, NIC / bytes_per_step)
Model, everything on one machine with C cores (hetrl local): every env step costs 1/r
core-seconds in a worker and 1/L in the learner, so
  X(w) = min(w * r, L, C / (1/r + 1/L)).
It is validated with `launch.run_local` (unpinned, 1 and 2 workers): steady-state steps/s
from metrics.jsonl against the prediction. Run: `python -m bench.scaling [--quick]`.
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

from bench import common, harness, learner_throughput
from hetrl.launch import run_local
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.settings import TrainSettings
from hetrl.rollout.envs import describe_env
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import PolicySettings, WorkerSettings
from hetrl.rollout.transport import new_token


@dataclasses.dataclass
class Settings:
    """Scaling model from measured r (worker) and L (learner), validated locally."""

    env: str = "CartPole-v1"
    """Env (hetrl's default; the learner is a real share of the work here)."""
    envs_per_worker: int = 8
    """N."""
    fragment_length: int = 64
    """T."""
    validate_workers: tuple[int, ...] = (1, 2)
    """Worker counts to run hetrl local with on this machine."""
    validate_steps: int = 200_000
    """Env steps per validation run."""
    repeats: int = 3
    """Measurements of r and L, and validation runs per worker count."""
    nic_gbit: float = 10.0
    """NIC bandwidth per host for the cluster table, Gbit/s."""
    hosts: tuple[int, ...] = (1, 2, 4, 8)
    """k of the cluster table."""
    workers_per_host: tuple[int, ...] = (1, 4, 16)
    """w of the cluster table."""
    seed: int = 1
    """Seed."""
    quick: bool = False
    """One short measurement and run each."""


def measure_worker(s: Settings) -> tuple[list[float], float]:
    """Streamed steps/s of one pinned worker, and bytes per env step."""
    producer, consumer_cpus = harness.placement("split")
    everything = set(os.sched_getaffinity(0))
    harness.pin_this_process(consumer_cpus)
    settings = WorkerSettings(env=s.env, envs_per_worker=s.envs_per_worker,
                              fragment_length=s.fragment_length, seed=s.seed)
    token = new_token()
    worker, address = harness.start_worker(settings, producer, token, "scaling-worker")
    consumer = None
    try:
        weights = harness.weights_message(harness.initial_weights(settings))
        consumer = harness.Consumer(address, token, harness.stream_spec(settings), weights)
        consumer.window(1.0, 2)
        windows = [consumer.window(2.0 if not s.quick else 0.5) for _ in range(s.repeats)]
    finally:
        if consumer is not None:
            consumer.close()
        harness.stop(worker)
        harness.pin_this_process(everything)  # hetrl local below runs unpinned
    return [w.steps_per_s for w in windows], windows[0].bytes_per_s / windows[0].steps_per_s


def measure_learner(s: Settings) -> list[float]:
    desc = describe_env(WorkerSettings(env=s.env))
    torch.set_num_threads(1)
    torch.manual_seed(s.seed)
    cfg = TrainSettings()
    policy = Policy(desc.observation_space, desc.action_space, PolicySettings())
    optimizer = PolicyAdam(policy, cfg.learning_rate)
    lt = learner_throughput.Settings(fragment_length=s.fragment_length,
                                     envs_per_worker=s.envs_per_worker)
    rng = np.random.default_rng(s.seed)
    rates = []
    for i in range(s.repeats + 1):
        frags = learner_throughput.fragments(desc.observation_space, desc.action_space, lt,
                                             cfg.batch_fragments(2), rng)
        step = learner_throughput.learner_step(policy, optimizer, frags, cfg)
        if i:
            rates.append(step["steps"] / step["total"])
    return rates


def validate(s: Settings, workers: int, run: int) -> tuple[float, float]:
    """Steady-state steps/s of hetrl local (first to last metrics record)."""
    out = common.RESULTS / "runs" / f"scaling-w{workers}-{run}"
    shutil.rmtree(out, ignore_errors=True)
    load = common.ForeignLoad([os.getpid()], children=True).start()
    result = run_local(env=s.env, workers=workers, envs_per_worker=s.envs_per_worker,
                       fragment_length=s.fragment_length, total_steps=s.validate_steps,
                       seed=s.seed, out=str(out), progress=False)
    other = load.stop()
    if not result.ok:
        raise RuntimeError(f"hetrl local failed: {result.summary}")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = records[len(records) // 10], records[-1]  # skip the first tenth
    return (last["global_step"] - first["global_step"]) / (
        last["wall_seconds"] - first["wall_seconds"]), other


def local_model(w: int, r: float, learner: float, cores: int) -> float:
    return min(w * r, learner, cores / (1 / r + 1 / learner))


def cluster_model(k: int, w: int, r: float, learner: float, nic: float, bps: float) -> float:
    return min(k * w * r, learner, k * nic / bps, nic / bps)


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, repeats=1, validate_steps=30_000)
    t0 = time.perf_counter()
    r_runs, bytes_per_step = measure_worker(s)
    l_runs = measure_learner(s)
    r, learner = float(np.median(r_runs)), float(np.median(l_runs))
    cores = len(os.sched_getaffinity(0))
    rows, checks = [], []
    for w in s.validate_workers:
        runs = [validate(s, w, i) for i in range(s.repeats)]
        stat = common.summarize([m for m, _ in runs])
        other = float(np.median([o for _, o in runs]))
        predicted = local_model(w, r, learner, cores)
        # The same model with the cores that other processes left us during the runs.
        predicted_free = local_model(w, r, learner, max(0.5, cores - other))
        checks.append({"workers": w, "predicted": predicted, "measured": stat,
                       "error": stat["median"] / predicted - 1, "other_load_cores": other,
                       "predicted_free_cores": predicted_free,
                       "error_free_cores": stat["median"] / predicted_free - 1})
        rows.append([w, f"{predicted:,.0f}", f"{other:.2f}", f"{predicted_free:,.0f}",
                     common.fmt(stat), f"{stat['median'] / predicted - 1:+.1%}",
                     f"{stat['median'] / predicted_free - 1:+.1%}"])
    common.print_table(
        f"Scaling model on this machine ({cores} cores, {s.env}): r = {r:,.0f} steps/s per "
        f"worker, L = {learner:,.0f} samples/s; X(w) = min(w r, L, C / (1/r + 1/L))",
        ["workers", "predicted (C cores)", "others' load", "predicted (C - load)",
         "hetrl local measured", "error", "error (C - load)"], rows)
    nic = s.nic_gbit * 1e9 / 8
    table = [[k, *[f"{cluster_model(k, w, r, learner, nic, bytes_per_step):,.0f}"
                   for w in s.workers_per_host]] for k in s.hosts]
    common.print_table(
        f"Predicted steps/s, k env hosts x w workers (one core each), CPU learner L as "
        f"measured here, {s.nic_gbit:g} Gbit/s NICs, {bytes_per_step:,.0f} B per step",
        ["hosts k", *[f"w={w}" for w in s.workers_per_host]], table)
    results = {"r_steps_per_s": common.summarize(r_runs), "bytes_per_step": bytes_per_step,
               "learner_samples_per_s": common.summarize(l_runs), "cores": cores,
               "validation": checks, "cluster_prediction": {
                   f"k={row[0]}": dict(zip([f"w={w}" for w in s.workers_per_host], row[1:],
                                           strict=True)) for row in table},
               "seconds": time.perf_counter() - t0}
    results["summary"] = {f"w={c['workers']}": {k: c[k] for k in (
        "predicted", "error", "predicted_free_cores", "error_free_cores")} | {
        "measured": c["measured"]["median"]} for c in checks}
    common.write_json("scaling", s, results)
    return results


if __name__ == "__main__":
    main()
