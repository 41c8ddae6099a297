"""Processes and the consuming learner stand-in used by the streaming benchmarks.

- `placement` decides which cores the producer (a rollout worker, or the in-process
  baseline) and the consumer get: with two or more usable cores the producer is
  pinned to one core and the consumer to another, so "one worker per core" holds and
  the two sides do not take turns on a core; `shared` pins nothing.
- `start_worker` runs the real `python -m hetrl.rollout.worker SETTINGS_JSON` process.
- `Consumer` is the learner's receive path and nothing else: a real
  `learner.connections.WorkerStream` (its thread decodes every fragment with
  `rollout.fragments.from_message`) whose credits are returned the moment a fragment
  is taken off the fan-in queue. Nothing is trained.
- `python -m bench.harness baseline SETTINGS_JSON` is the in-process baseline: the
  same `RolloutWorker` construction (vector env, policy, seeds, torch threads) and
  weights, whose `Collector` is stepped with nothing encoded or sent. It runs as a
  child so it sits on the producer's core; it reads one JSON command per line.

The producer and the baseline are never busy at the same time: the worker idles
without credits while the baseline runs, the baseline blocks on stdin otherwise.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import queue
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, ROOT

LOGS = RESULTS / "logs"


# -- cores ---------------------------------------------------------------------------
def placement(kind: str) -> tuple[set[int] | None, set[int] | None]:
    """(producer cpus, consumer cpus); None means unpinned."""
    cpus = sorted(os.sched_getaffinity(0))
    if kind == "shared" or len(cpus) < 2:
        return None, None
    return {cpus[0]}, {cpus[1]}


def pin_this_process(cpus: set[int] | None) -> None:
    """Pin every thread of this process (threads started later inherit it)."""
    if cpus is None:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass


def spawn(args: list[str], cpus: set[int] | None, log_name: str, token: str = "",
          pipe: bool = False) -> subprocess.Popen:
    """Start `python ARGS` as hetrl starts its own children (launch.processes: `python -P`,
    the child environment with `token`, tied to this process's life), with this checkout
    on its path, stderr (and stdout, unless `pipe` makes stdin and stdout text pipes) in
    results/logs/LOG_NAME.log; then pin it to `cpus`. Pinning right after the start
    reaches the child before it has imported anything, so every thread it starts
    inherits the pin; nothing runs between fork and exec (launch.processes says why)."""
    from hetrl.launch.processes import PYTHON, child_environment, spawn_command

    (LOGS / f"{log_name}.log").unlink(missing_ok=True)  # this run's lines only
    env = child_environment(token)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env["PYTHONPATH"]])
    child = spawn_command(log_name, [*PYTHON, *args], env, LOGS / f"{log_name}.log",
                          talk=pipe)
    if cpus is not None:
        os.sched_setaffinity(child.process.pid, cpus)
    return child.process


def stop(process: subprocess.Popen, timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# -- the real worker and its consumer ------------------------------------------------------
def initial_weights(settings) -> dict[str, np.ndarray]:
    """The weights both sides sample with: a Policy initialised from settings.seed."""
    import torch

    from hetrl.rollout.envs import describe_env
    from hetrl.rollout.policy import Policy, policy_arrays

    desc = describe_env(settings)
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        return policy_arrays(Policy(desc.observation_space, desc.action_space, settings))


def start_worker(settings, cpus: set[int] | None, token: str, log_name: str):
    """Run `python -m hetrl.rollout.worker`; return (process, address)."""
    from hetrl.rollout.settings import to_json

    tmp = Path(tempfile.mkdtemp(prefix="hetrl-bench-"))
    ready = tmp / "ready.json"
    settings = dataclasses.replace(settings, ready_file=str(ready), port=0,
                                   learner_timeout=600.0)
    (tmp / "worker.json").write_text(to_json(settings))
    process = spawn(["-m", "hetrl.rollout.worker", str(tmp / "worker.json")], cpus, log_name,
                    token)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"worker did not start; see {LOGS / log_name}.log")
        time.sleep(0.05)
    return process, json.loads(ready.read_text())["address"]


def _nbytes(arrays) -> int:
    """Payload bytes of a FragmentArrays (its array fields only)."""
    return sum(v.nbytes for v in vars(arrays).values() if isinstance(v, np.ndarray))


@dataclasses.dataclass
class Window:
    """One timed stretch of steady-state fragments."""

    steps_per_s: float
    bytes_per_s: float
    fragments: int
    seconds: float
    collect_fraction: float  # share of the window the worker spent in Collector.collect
    wait_fraction: float  # share it spent waiting for credits


def stream_spec(settings):
    """The StreamSpec a learner would build for these settings' env."""
    from hetrl.learner.connections import StreamSpec
    from hetrl.rollout.envs import action_dtype, describe_env
    from hetrl.rollout.observations import ObsLayout

    desc = describe_env(settings)
    obs, act = desc.observation_space, desc.action_space
    return StreamSpec(settings.env, str(obs), str(act), ObsLayout.of(obs),
                      tuple(act.shape or ()), action_dtype(act))


def weights_message(arrays: dict[str, np.ndarray], version: int = 0):
    from hetrl.protos import hetrl_pb2
    from hetrl.rollout import wire

    return hetrl_pb2.Weights(version=version, arrays=wire.encode_named(arrays))


class Consumer:
    """The learner's receive path: WorkerStream decodes, credits go straight back."""

    def __init__(self, address: str, token: str, spec, weights) -> None:
        from hetrl.learner.connections import StreamState, WorkerStream

        self.fan_in: queue.Queue = queue.Queue()
        self.stream = WorkerStream(address, token, spec, self.fan_in, weights, credits=0,
                                   connect_timeout=60.0)
        self.stream.start()
        # Credits put before the stream is up would go to an outbox it then replaces.
        deadline = time.monotonic() + 60.0
        while self.stream.state is not StreamState.STREAMING:
            if not self.stream.alive or time.monotonic() > deadline:
                raise RuntimeError(f"could not stream from {address}: {self._failure()}")
            time.sleep(0.01)
        # return_credit() takes the stream generation in newer versions of connections.py.
        self._needs_generation = "generation" in inspect.signature(
            self.stream.return_credit).parameters

    def _failure(self) -> str:
        try:
            return str(self.fan_in.get_nowait())
        except queue.Empty:
            return "no error reported"

    def _credit(self) -> None:
        if self._needs_generation:
            self.stream.return_credit(self.stream.generation)
        else:
            self.stream.return_credit()

    def _get(self, timeout: float):
        from hetrl.learner.connections import StreamFailure

        item = self.fan_in.get(timeout=timeout)
        if isinstance(item, StreamFailure):
            raise RuntimeError(f"stream failed: {item.error}")
        return item[-1]  # (stream, fragment) or (stream, generation, fragment)

    def window(self, seconds: float, min_intervals: int = 4, credits: int = 2) -> Window:
        """Grant credits, time fragment arrivals for `seconds`, then let the worker idle.

        The first arrival starts the clock (its fragment is not counted), so the rate
        is steady-state: (fragments after the first) / (last arrival - first arrival).
        """
        for _ in range(credits):
            self._credit()
        outstanding, times = credits, []
        steps = nbytes = 0
        collect = wait = 0.0
        while True:
            fragment = self._get(timeout=120.0)
            times.append(time.perf_counter())
            outstanding -= 1
            if len(times) > 1:
                a = fragment.arrays
                steps += fragment.steps
                nbytes += _nbytes(a)
                collect += a.collect_seconds
                wait += fragment.wait_seconds
            if len(times) - 1 >= min_intervals and times[-1] - times[0] >= seconds:
                break
            self._credit()
            outstanding += 1
        while outstanding:  # drain what is in flight; the worker then waits for credits
            self._get(timeout=120.0)
            outstanding -= 1
        span = times[-1] - times[0]
        return Window(steps / span, nbytes / span, len(times) - 1, span,
                      collect / span, wait / span)

    def close(self) -> None:
        self.stream.stop("benchmark over", timeout=10.0)


class Baseline:
    """Parent side of the in-process baseline child."""

    def __init__(self, settings, cpus: set[int] | None, log_name: str):
        from hetrl.rollout.settings import to_json

        self.path = Path(tempfile.mkdtemp(prefix="hetrl-bench-")) / "baseline.json"
        self.path.write_text(to_json(settings))
        self.process = spawn(["-m", "bench.harness", "baseline", str(self.path)], cpus,
                             log_name, pipe=True)

    def window(self, seconds: float, min_intervals: int = 4) -> Window:
        self.process.stdin.write(json.dumps({"seconds": seconds, "min": min_intervals}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"baseline child died; see {LOGS}")
        return Window(**json.loads(line))

    def close(self) -> None:
        stop(self.process)


def _baseline_main(settings_path: str) -> int:
    """Child: build what a worker builds, then step the collector on command."""
    from hetrl.rollout.lifetime import die_with_parent
    from hetrl.rollout.policy import load_policy_arrays
    from hetrl.rollout.settings import WorkerSettings, from_json
    from hetrl.rollout.worker import RolloutWorker

    die_with_parent()  # first: no child outlives the benchmark
    settings = from_json(WorkerSettings, Path(settings_path).read_text())
    worker = RolloutWorker(settings)  # same envs, policy, seeds and torch threads
    load_policy_arrays(worker.policy, initial_weights(settings))
    for line in sys.stdin:
        command = json.loads(line)
        worker.collector.collect()  # like the stream: the first fragment starts the clock
        start = time.perf_counter()
        steps = nbytes = fragments = 0
        collect = 0.0
        while True:
            arrays = worker.collector.collect()
            fragments += 1
            steps += arrays.rewards.size
            nbytes += _nbytes(arrays)
            collect += arrays.collect_seconds
            span = time.perf_counter() - start
            if fragments >= command["min"] and span >= command["seconds"]:
                break
        print(json.dumps(dataclasses.asdict(
            Window(steps / span, nbytes / span, fragments, span, collect / span, 0.0))),
            flush=True)
    worker.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["baseline"]:
        raise SystemExit(_baseline_main(sys.argv[2]))
    raise SystemExit("usage: python -m bench.harness baseline SETTINGS_JSON")
