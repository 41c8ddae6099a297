"""Benchmark 1, collection overhead: what streaming costs a rollout worker.

Numerator: env steps/s delivered by one real rollout worker (`python -m hetrl.rollout.worker`,
one torch thread) streaming to a consumer that does the learner's receive path only
(`WorkerStream` decodes every fragment; credits are returned at once; nothing is
trained). Denominator: the same `RolloutWorker` construction (vector env, policy,
seeds, weights, torch threads) in a child process whose `Collector` is stepped with
nothing encoded or sent. With two or more cores the worker and the baseline share
one pinned core and the consumer gets another, so the ratio charges the worker for
what it does itself (encoding, protobuf, gRPC's threads on its core, waiting for
credits), not for the consumer's share of a core; `--placement shared` pins nothing.

Both sides run in one invocation, interleaved (baseline then stream, then the other
order), and the ratio of each pair is reported as median [min-max] over repeats.
The sweep shows the ratio against envs per worker (N) and fragment length (T).
Run: `python -m bench.overhead [--quick]`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

import tyro

from bench import common, harness
from hetrl.rollout.settings import WorkerSettings
from hetrl.rollout.transport import new_token

ALIASES = {"pong": "bench.envs:make_pong"}
TARGETS = {"Humanoid-v5": 0.95, "HalfCheetah-v5": 0.95, "CartPole-v1": 0.8, "pong": 0.9}


@dataclasses.dataclass
class Settings:
    """Collection overhead: a streaming worker vs its collector with nothing sent."""

    envs: tuple[str, ...] = ("Humanoid-v5", "HalfCheetah-v5", "CartPole-v1", "pong")
    """Envs of the headline table ("pong" is bench.envs:make_pong)."""
    envs_per_worker: int = 8
    """N of the headline table (hetrl's default)."""
    fragment_length: int = 64
    """T of the headline table (hetrl's default)."""
    repeats: int = 5
    """Baseline/stream pairs per configuration."""
    seconds: float = 3.0
    """Length of each timed window."""
    sweep_env: str = "CartPole-v1"
    """Env of the N and T sweeps (the cheapest env shows the overhead best)."""
    sweep_n: tuple[int, ...] = (1, 8, 32)
    """Envs per worker to sweep at the default T."""
    sweep_t: tuple[int, ...] = (16, 64, 256)
    """Fragment lengths to sweep at the default N."""
    sweep_repeats: int = 3
    """Pairs per sweep point."""
    sweep_seconds: float = 2.0
    """Window length of sweep points."""
    credits: int = 2
    """Fragments the consumer lets the worker run ahead (hetrl's default)."""
    placement: Literal["split", "shared"] = "split"
    """split: worker and baseline on one core, consumer on another; shared: unpinned."""
    seed: int = 1
    """Seed of envs, weights and sampling (the same on both sides)."""
    quick: bool = False
    """A short smoke run (one short pair per configuration, a two-point sweep)."""
    plot: bool = True
    """Draw bench/results/overhead.png (needs matplotlib)."""


def measure(env: str, n: int, t: int, repeats: int, seconds: float, s: Settings) -> dict:
    """Interleaved baseline/stream windows on one worker and one baseline child."""
    producer, consumer_cpus = harness.placement(s.placement)
    harness.pin_this_process(consumer_cpus)
    settings = WorkerSettings(env=ALIASES.get(env, env), envs_per_worker=n,
                              fragment_length=t, seed=s.seed)
    token = new_token()
    tag = f"overhead-{env.replace(':', '_')}-N{n}-T{t}"
    baseline = harness.Baseline(settings, producer, f"{tag}-baseline")
    worker, address = harness.start_worker(settings, producer, token, f"{tag}-worker")
    consumer = None
    try:
        weights = harness.weights_message(harness.initial_weights(settings))
        consumer = harness.Consumer(address, token, harness.stream_spec(settings), weights)
        warm = min(1.0, seconds)
        baseline.window(warm, 2)
        consumer.window(warm, 2, s.credits)
        base, stream, ratio, foreign = [], [], [], []
        load = common.ForeignLoad([os.getpid(), worker.pid, baseline.process.pid])
        for i in range(repeats):
            load.start()
            if i % 2 == 0:
                b = baseline.window(seconds)
                w = consumer.window(seconds, credits=s.credits)
            else:
                w = consumer.window(seconds, credits=s.credits)
                b = baseline.window(seconds)
            base.append(b)
            stream.append(w)
            ratio.append(w.steps_per_s / b.steps_per_s)
            foreign.append(load.stop())
    finally:
        if consumer is not None:
            consumer.close()
        harness.stop(worker)
        baseline.close()
    return {
        "env": env, "envs_per_worker": n, "fragment_length": t,
        "fragment_mib": stream[0].bytes_per_s / stream[0].steps_per_s * n * t / 2**20,
        "baseline_steps_per_s": common.summarize([b.steps_per_s for b in base]),
        "stream_steps_per_s": common.summarize([w.steps_per_s for w in stream]),
        "ratio": common.summarize(ratio),
        "stream_mib_per_s": common.summarize([w.bytes_per_s / 2**20 for w in stream]),
        "worker_collect_fraction": common.summarize([w.collect_fraction for w in stream]),
        # Split of the loss: stepping itself slowed (gRPC threads on the core, caches)
        # vs time the worker spent outside Collector.collect (encode, send, credits).
        "collect_slowdown": common.summarize(
            [(w.steps_per_s / w.collect_fraction) / (b.steps_per_s / b.collect_fraction)
             for w, b in zip(stream, base, strict=True)]),
        "worker_credit_wait_fraction": common.summarize([w.wait_fraction for w in stream]),
        "other_load_cores": common.summarize(foreign),
        "placement": s.placement,
    }


def row(r: dict, target: float | None) -> list:
    med = r["ratio"]["median"]
    return [
        r["env"], f"{r['envs_per_worker']}x{r['fragment_length']}", f"{r['fragment_mib']:.2f}",
        common.fmt(r["baseline_steps_per_s"]), common.fmt(r["stream_steps_per_s"]),
        common.fmt(r["ratio"], ".3f"), "-" if target is None else f">= {target}",
        "-" if target is None else common.verdict(med, target),
        common.fmt(r["collect_slowdown"], ".3f"),
        common.fmt(r["worker_collect_fraction"], ".3f"),
        common.fmt(r["worker_credit_wait_fraction"], ".3f"),
        common.fmt(r["other_load_cores"], ".2f"),
    ]


HEADER = ["env", "N x T", "frag MiB", "baseline steps/s", "streamed steps/s",
          "ratio", "target", "", "in-collect speed", "collect frac", "credit-wait frac",
          "other load (cores)"]


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, repeats=1, seconds=0.5, sweep_repeats=1, sweep_seconds=0.5,
                                sweep_n=(1, 32), sweep_t=())
    headline = []
    for env in s.envs:
        print(f"measuring {env} N={s.envs_per_worker} T={s.fragment_length} ...", flush=True)
        headline.append(measure(env, s.envs_per_worker, s.fragment_length, s.repeats,
                                s.seconds, s))
    common.print_table(
        f"Collection overhead: streamed / in-process env steps/s, one worker "
        f"(placement {s.placement}; median [min-max] of {s.repeats} pairs)",
        HEADER, [row(r, TARGETS.get(r["env"])) for r in headline])

    points = [(n, s.fragment_length) for n in s.sweep_n] + \
             [(s.envs_per_worker, t) for t in s.sweep_t if t != s.fragment_length]
    sweep = []
    for n, t in points:
        print(f"sweep {s.sweep_env} N={n} T={t} ...", flush=True)
        sweep.append(measure(s.sweep_env, n, t, s.sweep_repeats, s.sweep_seconds, s))
    if sweep:
        common.print_table(f"Sweep on {s.sweep_env}: ratio vs envs per worker and fragment "
                           f"length ({s.sweep_repeats} pairs)", HEADER,
                           [row(r, None) for r in sweep])

    results = {"targets": TARGETS, "headline": headline, "sweep": sweep}
    common.write_json("overhead", s, results)

    def draw(plt) -> None:
        plt.subplot(1, 2, 1)
        by_n = [r for r in sweep if r["fragment_length"] == s.fragment_length]
        common.errorbar(plt, [r["envs_per_worker"] for r in by_n], [r["ratio"] for r in by_n],
                        f"T={s.fragment_length}")
        plt.xscale("log", base=2)
        plt.xlabel("envs per worker (N)")
        plt.ylabel(f"streamed / in-process steps/s ({s.sweep_env})")
        plt.subplot(1, 2, 2)
        by_t = sorted((r for r in sweep if r["envs_per_worker"] == s.envs_per_worker),
                      key=lambda r: r["fragment_length"])
        common.errorbar(plt, [r["fragment_length"] for r in by_t], [r["ratio"] for r in by_t],
                        f"N={s.envs_per_worker}")
        plt.xscale("log", base=2)
        plt.xlabel("fragment length (T)")

    if sweep:
        common.plot(common.stem("overhead", s), draw, s.plot)
    return results


if __name__ == "__main__":
    main()
