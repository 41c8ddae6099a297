"""Profile the streaming path: where a rollout worker's and the consumer's time goes.

Starts the same pair as bench.overhead (a real `python -m hetrl.rollout.worker` pinned to
one core, the `WorkerStream` consumer on another), keeps fragments flowing, and runs
py-spy (`pip install py-spy`) on both processes, sampling every thread including idle
ones (`--idle --threads --nonblocking`, py-spy itself on the consumer's core). Each
thread's samples are put in buckets by the first matching frame (leaf first), e.g.
env stepping, policy inference, fragment encoding, protobuf serialization, waiting
for gRPC to take the message, waiting for credits. Output: a table per process and
bench/results/profile-<env>.json with the raw bucket counts and the top frames.
Run: `python -m bench.profile --env pong`.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import subprocess
import threading
import time

import tyro

from bench import common, harness
from bench.overhead import ALIASES
from hetrl.rollout.settings import WorkerSettings
from hetrl.rollout.transport import new_token

# (bucket, substrings of a frame "function (file:line)"); the leaf-most match wins.
BUCKETS = [
    ("credit wait (inbox.wait_ready)", ("wait_ready",)),
    ("env step", ("step (gymnasium", "step (mujoco", "step (ale_py", "AtariPreprocessing",
                  "step (gymnasium/wrappers", "step (gymnasium/envs")),
    ("policy.act", ("act (rollout/policy.py",)),
    ("collector bookkeeping", ("collect (rollout/collector.py",)),
    ("fragments.serialize (encode)", ("serialize (rollout/fragments.py",)),
    ("protobuf serialize (grpc serializer)", ("_serialize_response", "serialize (grpc/_common",
                                              "_serialize")),
    ("grpc send wait (server waits for the send)", ("_send_response", "_send_message")),
    ("fragments.from_message (decode)", ("from_message (rollout/fragments.py",)),
    ("grpc receive (next message)", ("_next (grpc/_channel", "__next__ (grpc/_channel",
                                     "_next_response", "next (grpc")),
    ("fan-in queue / credits", ("queue.py", "_get (bench", "window (bench",
                                "return_credit")),
    ("weights load", ("load_policy_arrays",)),
]


@dataclasses.dataclass
class Settings:
    """Profile a streaming worker and its consumer with py-spy."""

    env: str = "pong"
    """Env to stream ("pong" is bench.envs:make_pong)."""
    envs_per_worker: int = 8
    """N."""
    fragment_length: int = 64
    """T."""
    seconds: float = 15.0
    """Sampling time."""
    rate: int = 250
    """py-spy samples per second."""
    placement: str = "split"
    """split or shared, as in bench.overhead."""
    quick: bool = False
    """Sample for 3 s."""


def _record(pid: int, seconds: float, rate: int, out: str, cpus) -> subprocess.Popen:
    args = [shutil.which("py-spy") or "py-spy", "record", "-p", str(pid), "-d",
            str(int(seconds)), "-r", str(rate), "-f", "raw", "-o", out, "--idle",
            "--threads", "--nonblocking"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)


def summarize_raw(path: str) -> dict:
    """Bucket py-spy raw (collapsed) stacks per thread."""
    threads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    leaves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            thread = frames[0].partition(": ")[2] or frames[0]  # "thread (tid): name"
            bucket = "other"
            for frame in reversed(frames[1:]):
                hit = next((b for b, keys in BUCKETS if any(k in frame for k in keys)), None)
                if hit:
                    bucket = hit
                    break
            threads[thread][bucket] += int(count)
            leaves[thread][frames[-1][:90]] += int(count)
    out = {}
    for thread, counter in threads.items():
        total = sum(counter.values())
        out[thread] = {"samples": total,
                       "buckets": {k: v / total for k, v in counter.most_common()},
                       "top_leaves": {k: v / total for k, v in leaves[thread].most_common(12)}}
    return out


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    if s.quick:
        s = dataclasses.replace(s, seconds=3.0)
    producer, consumer_cpus = harness.placement(s.placement)
    harness.pin_this_process(consumer_cpus)
    settings = WorkerSettings(env=ALIASES.get(s.env, s.env), envs_per_worker=s.envs_per_worker,
                              fragment_length=s.fragment_length)
    token = new_token()
    worker, address = harness.start_worker(settings, producer, token, "profile-worker")
    weights = harness.weights_message(harness.initial_weights(settings))
    consumer = harness.Consumer(address, token, harness.stream_spec(settings), weights)
    common.RESULTS.mkdir(parents=True, exist_ok=True)
    outs = {"worker": str(common.RESULTS / "profile-worker.raw"),
            "consumer": str(common.RESULTS / "profile-consumer.raw")}
    try:
        consumer.window(1.0, 2)  # warm up
        stop = threading.Event()
        windows = []

        def keep_streaming() -> None:
            while not stop.is_set():
                windows.append(consumer.window(1.0))

        feeder = threading.Thread(target=keep_streaming, daemon=True)
        feeder.start()
        time.sleep(0.5)
        spies = [_record(worker.pid, s.seconds, s.rate, outs["worker"], consumer_cpus),
                 _record(os.getpid(), s.seconds, s.rate, outs["consumer"], consumer_cpus)]
        for spy in spies:
            spy.wait(s.seconds + 60)
        stop.set()
        feeder.join(60)
    finally:
        consumer.close()
        harness.stop(worker)
    rate = common.summarize([w.steps_per_s for w in windows])
    results = {"env": s.env, "steps_per_s_while_profiled": rate}
    for side, path in outs.items():
        summary = summarize_raw(path)
        results[side] = summary
        busy = {t: d for t, d in summary.items()
                if side == "consumer" or d["buckets"].get("env step", 0) > 0.05} or summary
        for thread, data in busy.items():
            if side == "consumer" and "fragments.from_message (decode)" not in data["buckets"]:
                continue
            common.print_table(
                f"{side} thread {thread}: share of wall time ({data['samples']} samples, "
                f"{s.env} N={s.envs_per_worker} T={s.fragment_length}, "
                f"{common.fmt(rate)} steps/s while profiled)",
                ["bucket", "share"], [[k, f"{v:.1%}"] for k, v in data["buckets"].items()])
    common.write_json(f"profile-{s.env.replace(':', '_')}", s, results)
    return results


if __name__ == "__main__":
    main()
