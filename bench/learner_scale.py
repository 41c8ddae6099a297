"""Benchmark: the learner alone at scale, fed by N synthetic workers over real gRPC.

Each synthetic worker is a process with a real gRPC server on loopback that speaks the
worker's side of the stream (Hello, then one prebuilt fragment per credit, stamped with
the newest weights version it was sent) with no env and no policy, so nothing but the
learner bounds the run. The real `Learner` (stream threads, batcher, update, weights
publisher) trains on them for --seconds after a warm-up, in this process. Reported per
configuration: ingest samples/s (env steps trained on per second), learner busy (share of
the training thread's time spent training), GPU busy (NVML, when there is a GPU), mean
policy lag, fragments dropped for lag, and the update-only ceiling: `ppo_update` alone on
a batch of the same shape already on the device, as bench.learner_throughput measures it.
Ingest / ceiling is the figure the pipeline is judged by (the issue's target: >= 80% on
the GPU machine with 14 streams). The update's own time inside the run next to its time
alone shows what the other threads (GIL, CPU) cost the training thread.
Run: `python -m bench.learner_scale [--quick]`.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import tempfile
import threading
import time
import uuid

import gymnasium as gym
import numpy as np
import torch
import tyro

from bench import common, learner_throughput

MODELS = {
    "mlp / Humanoid-v5": "bench.learner_scale:HumanoidShaped",
    "cnn / Pong 4x84x84 u8": "bench.learner_scale:PongShaped",
    "mlp / CartPole-v1": "bench.learner_scale:CartPoleShaped",
}


class _Shaped(gym.Env):
    """An env that only has the spaces of the one it stands for (the learner reads them)."""

    model = ""

    def __init__(self, **_kwargs) -> None:
        self.observation_space, self.action_space, _ = learner_throughput.MODELS[self.model]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class HumanoidShaped(_Shaped):
    model = "mlp / Humanoid-v5"


class PongShaped(_Shaped):
    model = "cnn / Pong 4x84x84 u8"


class CartPoleShaped(_Shaped):
    model = "mlp / CartPole-v1"


@dataclasses.dataclass
class Settings:
    """The learner alone at scale: N synthetic gRPC workers feeding the real learner."""

    models: tuple[str, ...] = ("mlp / Humanoid-v5", "cnn / Pong 4x84x84 u8")
    """Model/observation pairs (bench.learner_throughput's)."""
    workers: tuple[int, ...] = (2, 14)
    """Synthetic worker counts (gRPC streams) to try."""
    fragments_per_batch: str = "auto"
    """The learner's --fragments-per-batch (auto, or a number)."""
    seconds: float = 20.0
    """Measured seconds per configuration, after the warm-up."""
    warmup_seconds: float = 8.0
    """Seconds of training before measuring (streams connect, caches warm)."""
    device: str = "auto"
    """Learner device."""
    fragment_length: int = 64
    """T of each synthetic fragment."""
    envs_per_worker: int = 8
    """N of each synthetic fragment."""
    ceiling_repeats: int = 5
    """Timed update-only steps for the ceiling (the fastest one counts)."""
    seed: int = 1
    """Seed of the synthetic data and the network."""
    gil_probe: bool = True
    """Also time the update alone and beside a thread decoding and copying fragments."""
    quick: bool = False
    """CPU smoke form (about a minute here): the small MLP, 2 and 4 workers, 10 s each."""


# -- the synthetic worker (its own process) -------------------------------------------
def _serve(model: str, worker_id: int, t_len: int, n: int, token: str, seed: int,
           conn) -> None:
    import grpc

    from hetrl.protos import hetrl_pb2
    from hetrl.rollout import fragments
    from hetrl.rollout.fragments import FragmentArrays
    from hetrl.rollout.transport import create_server

    obs_space, act_space, _ = learner_throughput.MODELS[model]
    rng = np.random.default_rng(seed + worker_id)
    frag = learner_throughput.fragments(
        obs_space, act_space,
        learner_throughput.Settings(fragment_length=t_len, envs_per_worker=n), 1, rng)[0]
    arrays = FragmentArrays(**frag, episode_returns=np.array([1.0]),
                            episode_lengths=np.array([t_len]), collect_seconds=1e-3)
    incarnation = uuid.uuid4().hex
    hello = hetrl_pb2.WorkerMessage(hello=hetrl_pb2.Hello(
        worker_id=worker_id, incarnation=incarnation, num_envs=n, fragment_length=t_len,
        env=MODELS[model], observation_space=str(obs_space),
        action_space=str(act_space))).SerializeToString()
    stopped = threading.Event()

    def stream(requests, context):
        cond = threading.Condition()
        state = {"credits": 0, "version": -1, "done": False}

        def read():
            try:
                for raw in requests:
                    message = hetrl_pb2.LearnerMessage.FromString(raw)
                    kind = message.WhichOneof("kind")
                    with cond:
                        if kind == "weights":
                            state["version"] = message.weights.version
                        elif kind == "credits":
                            state["credits"] += message.credits.count
                        elif kind == "stop":
                            state["done"] = True
                        cond.notify_all()
            except grpc.RpcError:
                pass
            with cond:
                state["done"] = True
                cond.notify_all()

        threading.Thread(target=read, daemon=True).start()
        yield hello
        sequence = 0
        while True:
            start = time.perf_counter()
            with cond:
                cond.wait_for(lambda: state["done"] or (state["credits"] and
                                                        state["version"] >= 0))
                if state["done"]:
                    stopped.set()
                    return
                state["credits"] -= 1
                version = state["version"]
            yield fragments.serialize(arrays, worker_id, incarnation, sequence, version,
                                      time.perf_counter() - start)
            sequence += 1

    handler = grpc.stream_stream_rpc_method_handler(stream)
    server, port = create_server("127.0.0.1:0", token)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("hetrl.Rollout", {"Stream": handler}),))
    server.start()
    conn.send(f"127.0.0.1:{port}")
    conn.recv()  # the parent says when to go
    server.stop(1).wait(5)


def _gpu_sampler(device: torch.device):
    """A thread sampling NVML GPU utilisation every 0.1 s; (start, stop -> mean %)."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
    except Exception:
        return None
    samples: list[float] = []
    done = threading.Event()

    def run():
        while not done.wait(0.1):
            samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

    thread = threading.Thread(target=run, name="nvml", daemon=True)

    def stop() -> float | None:
        done.set()
        thread.join(2)
        return float(np.mean(samples)) if samples else None

    return thread.start, stop


# -- one configuration ----------------------------------------------------------------
def measure(model: str, workers: int, s: Settings) -> dict:
    from hetrl.learner.learner import Learner
    from hetrl.learner.settings import LearnerSettings
    from hetrl.rollout.transport import new_token

    token = new_token()
    ctx = mp.get_context("spawn")
    procs, conns, addresses = [], [], []
    for i in range(workers):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(model, i, s.fragment_length,
                                                s.envs_per_worker, token, s.seed, child),
                           daemon=True)
        proc.start()
        procs.append(proc)
        conns.append(parent)
    for conn in conns:
        if not conn.poll(120):
            raise RuntimeError("a synthetic worker did not start within 120 s")
        addresses.append(conn.recv())
    net = learner_throughput.MODELS[model][2]
    per_batch = s.fragments_per_batch if s.fragments_per_batch == "auto" \
        else int(s.fragments_per_batch)
    with tempfile.TemporaryDirectory() as out:
        settings = LearnerSettings(
            env=MODELS[model], policy=net, worker_addresses=tuple(addresses),
            total_steps=10**12, anneal_lr=False, fragments_per_batch=per_batch,
            device=s.device, out=out, progress=False, seed=s.seed)
        learner = Learner(settings, token)
        thread = threading.Thread(target=learner.run, name="learner-run", daemon=True)
        thread.start()
        time.sleep(s.warmup_seconds)  # a benchmark's warm-up, not a wait on a condition
        gpu = _gpu_sampler(learner.device)
        if gpu:
            gpu[0]()
        books, batcher = learner.books, learner.batcher
        start = (time.perf_counter(), learner.global_step, books.train_seconds,
                 books.wait_seconds, learner.version, batcher.dropped_lag)
        lags_before = dict(batcher.lag_histogram)
        time.sleep(s.seconds)
        end = (time.perf_counter(), learner.global_step, books.train_seconds,
               books.wait_seconds, learner.version, batcher.dropped_lag)
        lags = {k: v - lags_before.get(k, 0) for k, v in batcher.lag_histogram.items()}
        gpu_busy = gpu[1]() if gpu else None
        learner.request_stop("benchmark over")
        thread.join(60)
        device = learner.device
        for conn in conns:
            conn.send("stop")
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    wall, steps, train, wait, updates, dropped = (b - a for a, b in zip(start, end,
                                                                       strict=True))
    count = sum(lags.values())
    batch_fragments = (steps / max(updates, 1)) / (s.fragment_length * s.envs_per_worker)
    ceiling = update_ceiling(model, max(1, round(batch_fragments)), device, s)
    ingest = steps / wall
    return {
        "model": model, "workers": workers, "device": str(device),
        "fragments_per_batch": s.fragments_per_batch,
        "mean_fragments_per_batch": batch_fragments,
        "ingest_samples_per_s": ingest,
        "updates_per_s": updates / wall,
        "learner_busy": train / max(train + wait, 1e-9),
        "gpu_busy_percent": gpu_busy,
        "policy_lag_mean": sum(k * v for k, v in lags.items()) / count if count else None,
        "dropped_lag": dropped,
        "update_ms_in_run": 1e3 * train / max(updates, 1),
        **ceiling,
        "ingest_over_ceiling": ingest / ceiling["ceiling_samples_per_s"],
    }


def _update_setup(model: str, count: int, device: torch.device, s: Settings):
    """What timing one update needs: settings, the policy and its optimizer on `device`
    (as the learner builds them), `count` synthetic fragments, and the spaces."""
    from hetrl.learner.optimizer import PolicyAdam
    from hetrl.learner.settings import TrainSettings
    from hetrl.rollout.policy import Policy
    from hetrl.rollout.settings import PolicySettings

    obs_space, act_space, net = learner_throughput.MODELS[model]
    torch.manual_seed(s.seed)
    cfg = TrainSettings()
    policy = Policy(obs_space, act_space, PolicySettings(policy=net)).to(device)
    optimizer = PolicyAdam(policy, cfg.learning_rate)
    rng = np.random.default_rng(s.seed)
    lt = learner_throughput.Settings(fragment_length=s.fragment_length,
                                     envs_per_worker=s.envs_per_worker)
    frags = learner_throughput.fragments(obs_space, act_space, lt, count, rng)
    return cfg, policy, optimizer, frags, (obs_space, act_space)


def update_ceiling(model: str, fragments: int, device: torch.device, s: Settings) -> dict:
    """ppo_update alone on a batch of `fragments` fragments already on `device`."""
    from hetrl.learner.ppo import Batch, ppo_update
    from hetrl.rollout.fragments import STEP_FIELDS

    cfg, policy, optimizer, frags, _ = _update_setup(model, fragments, device, s)

    def stack(name: str) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([f[name] for f in frags], axis=1)).to(device)

    batch = Batch(**{name: stack(name) for name in STEP_FIELDS if name in frags[0]})
    times = []
    for i in range(s.ceiling_repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        ppo_update(policy, optimizer, batch, cfg)  # reads its stats back: synchronized
        if i:
            times.append(time.perf_counter() - t0)
    steps = batch.rewards.numel()
    # The fastest step: the ceiling is what the update can do when nothing else runs.
    return {"ceiling_samples_per_s": steps / min(times),
            "update_ms_alone": 1e3 * min(times)}


def gil_probe(model: str, s: Settings, repeats: int = 6, per_update: int = 2) -> dict:
    """What ingest work in another thread costs the update (the GIL, and a shared core):
    `ppo_update` on a batch of `per_update` fragments timed alone and while a second
    thread decodes `per_update` serialized fragments (`fragments.from_message`, as a
    stream thread does) and copies them into a batch buffer (as the batcher does): the
    ingest work of the next batch, overlapping this one's update as in the learner.
    Interleaved, fastest of `repeats` each."""
    from hetrl.learner.learner import resolve_device
    from hetrl.learner.ppo import Batch, ppo_update
    from hetrl.protos import hetrl_pb2
    from hetrl.rollout import fragments
    from hetrl.rollout.fragments import FragmentArrays
    from hetrl.rollout.observations import ObsLayout

    device = resolve_device(s.device)
    cfg, policy, optimizer, frags, (obs_space, act_space) = _update_setup(
        model, per_update, device, s)
    batch = Batch(**{
        k: torch.from_numpy(np.concatenate(
            [f[k] for f in frags], axis=1)).to(device) for k in frags[0]})
    arrays = FragmentArrays(**frags[0], episode_returns=np.zeros(1),
                            episode_lengths=np.zeros(1, np.int64))
    wire_bytes = fragments.serialize(arrays, 0, "i", 0, 0)
    expected = fragments.expected_steps(
        s.fragment_length, s.envs_per_worker, ObsLayout.of(obs_space),
        tuple(act_space.shape or ()), frags[0]["actions"].dtype)
    target = {k: np.empty_like(np.concatenate([v] * per_update, axis=1))
              for k, v in frags[0].items()}
    work = threading.Semaphore(0)
    done = threading.Event()
    ingested = [0]
    n = s.envs_per_worker

    def ingest():
        while not done.is_set():
            if not work.acquire(timeout=0.1):
                continue
            message = hetrl_pb2.WorkerMessage.FromString(wire_bytes).fragment
            fragment = fragments.from_message(message, expected)
            column = (ingested[0] % per_update) * n
            for k in target:
                target[k][:, column:column + n] = getattr(fragment.arrays, k)
            ingested[0] += 1

    thread = threading.Thread(target=ingest, daemon=True)
    thread.start()
    alone, beside = [], []
    ppo_update(policy, optimizer, batch, cfg)  # warm-up
    for round_ in range(repeats):
        for flag, times in ((False, alone), (True, beside)):
            if flag:  # the next batch's ingest, beside this update
                for _ in range(per_update):
                    work.release()
            t0 = time.perf_counter()
            ppo_update(policy, optimizer, batch, cfg)  # reads its stats: synchronized
            times.append(time.perf_counter() - t0)
            while flag and ingested[0] < (round_ + 1) * per_update:  # it finishes first
                time.sleep(0.001)
    done.set()
    thread.join(2)
    return {"model": model, "device": str(device), "update_ms_alone": 1e3 * min(alone),
            "update_ms_beside_ingest": 1e3 * min(beside),
            "slowdown": min(beside) / min(alone), "fragments_per_update": per_update}


def main(argv: list[str] | None = None) -> list[dict]:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, models=("mlp / Humanoid-v5",), workers=(2, 4),
                                seconds=10.0, warmup_seconds=6.0)
    torch.set_num_threads(1)  # as the learner process runs (--learner-torch-threads 1)
    results = []
    for model in s.models:
        for workers in s.workers:
            print(f"measuring {model}, {workers} synthetic workers ...", flush=True)
            results.append(measure(model, workers, s))
    common.print_table(
        f"The learner alone, fed by N synthetic gRPC workers (no env cost; "
        f"{s.fragment_length} x {s.envs_per_worker} per fragment, --fragments-per-batch "
        f"{s.fragments_per_batch}; {s.seconds:.0f} s after {s.warmup_seconds:.0f} s warm-up; "
        f"{os.cpu_count()} CPUs)",
        ["model", "workers", "device", "frags/batch", "ingest samples/s",
         "update-only ceiling", "ingest/ceiling", "learner busy", "GPU busy", "lag",
         "dropped", "update ms in run", "alone"],
        [[r["model"], r["workers"], r["device"], f"{r['mean_fragments_per_batch']:.1f}",
          f"{r['ingest_samples_per_s']:,.0f}", f"{r['ceiling_samples_per_s']:,.0f}",
          f"{r['ingest_over_ceiling']:.0%}", f"{r['learner_busy']:.0%}",
          "-" if r["gpu_busy_percent"] is None else f"{r['gpu_busy_percent']:.0f}%",
          "-" if r["policy_lag_mean"] is None else f"{r['policy_lag_mean']:.1f}",
          r["dropped_lag"], f"{r['update_ms_in_run']:.1f}", f"{r['update_ms_alone']:.1f}"]
         for r in results])
    per_update = max(s.workers) if s.fragments_per_batch == "auto" \
        else int(s.fragments_per_batch)
    probes = [gil_probe(model, s, per_update=per_update) for model in s.models] \
        if s.gil_probe else []
    if probes:
        common.print_table(
            "The GIL: ppo_update alone and beside a thread decoding + copying the next "
            "batch's fragments (fastest of 6 each, interleaved)",
            ["model", "device", "update ms alone", "beside ingest", "slowdown",
             "fragments per update"],
            [[p["model"], p["device"], f"{p['update_ms_alone']:.1f}",
              f"{p['update_ms_beside_ingest']:.1f}", f"{p['slowdown']:.2f}x",
              p["fragments_per_update"]]
             for p in probes])
    common.write_json("learner_scale", s, {"runs": results, "gil_probe": probes})
    return results


if __name__ == "__main__":
    main()
