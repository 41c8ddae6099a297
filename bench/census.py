"""Copy census: every step a fragment's bytes take from the env to a learner tensor.

Each step of the path is timed on one fragment with 16 MiB of observations and
divided by the time of one plain memcpy of those bytes (`np.copyto`), so ~1.0 means
"one copy", ~0 "a view". Where numpy can tell, aliasing is checked directly
(`np.shares_memory`). The copies inside gRPC's C core (send: the serialized
bytes into a slice; receive: each slice into a bytes object, then one join, in the
Cython receive path of gRPC's source) cannot be timed from Python; they are listed
from the source (grpcio 1.81 has no zero-copy option) and their cost shows up in the
`grpc` vs `raw tcp` rows of bench.transport. Used by bench.transport; runnable
alone as `python -m bench.census`.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from bench import common
from hetrl.protos import hetrl_pb2
from hetrl.rollout import fragments
from hetrl.rollout.fragments import FragmentArrays
from hetrl.rollout.observations import ObsLayout

T_LEN, N_ENVS = 64, 8


def _time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(quick: bool = False) -> list[dict]:
    repeats = 3 if quick else 15
    width = 16 * 2**20 // ((T_LEN + 1) * N_ENVS * 4)
    obs = np.random.default_rng(0).standard_normal((T_LEN + 1, N_ENVS, width), np.float32)
    step = (T_LEN, N_ENVS)
    arrays = FragmentArrays(
        observations=obs, actions=np.zeros(step, np.int64), rewards=np.zeros(step, np.float32),
        terminated=np.zeros(step, bool), truncated=np.zeros(step, bool),
        logprobs=np.zeros(step, np.float32), valid=np.ones(step, bool),
        episode_returns=np.zeros(0, np.float32), episode_lengths=np.zeros(0, np.int64))
    dst = np.empty_like(obs)
    memcpy = _time(lambda: np.copyto(dst, obs), repeats)

    env_obs = [obs[t].copy() for t in range(T_LEN + 1)]

    def collector_rows() -> None:
        for t in range(T_LEN + 1):
            dst[t] = env_obs[t]

    wire_bytes = fragments.serialize(arrays, 0, "x", 0, 0)
    parsed = hetrl_pb2.WorkerMessage.FromString(wire_bytes)
    data = parsed.fragment.observations.data
    view = np.frombuffer(data, np.float32).reshape(obs.shape)

    def decode():
        return fragments.from_message(parsed.fragment, fragments.expected_steps(
            T_LEN, N_ENVS, ObsLayout.box((width,), np.float32), (), np.dtype(np.int64)))

    decoded = decode().arrays.observations
    other = decoded.copy()
    batch = np.concatenate([decoded, other], axis=1)  # learner._to_batch, 2 fragments
    tensor = torch.from_numpy(batch)
    flat = tensor.reshape(-1, width)[: T_LEN * N_ENVS * 2]
    mask = torch.ones(flat.shape[0], dtype=torch.bool)

    side_w, side_l = "worker", "learner"
    stages = [
        (side_w, "Collector.collect: obs[t] = env obs, per step", collector_rows, None),
        (side_w, "fragments.serialize: one join of every array's buffer", lambda: (
            fragments.serialize(arrays, 0, "x", 0, 0)), None),
        (side_w, "gRPC core: bytes -> slice (grpc_slice_from_copied_buffer)", None, 1.0),
        (side_l, "gRPC core: slices -> bytes per slice -> joined bytes", None, 2.0),
        (side_l, "gRPC deserializer: WorkerMessage.FromString", lambda: (
            hetrl_pb2.WorkerMessage.FromString(wire_bytes)), None),
        (side_l, "NDArray.data attribute read", lambda: parsed.fragment.observations.data,
         None),
        (side_l, "np.frombuffer(...).reshape", lambda: np.frombuffer(
            data, np.float32).reshape(obs.shape), 0.0 if np.shares_memory(view, data) else None),
        (side_l, "= fragments.from_message, all of it", decode, None),
        (side_l, "learner._to_batch: np.concatenate (per fragment)", lambda: np.concatenate(
            [decoded, other], axis=1), None),
        (side_l, "torch.from_numpy(...).to('cpu')", lambda: torch.from_numpy(batch).to("cpu"),
         0.0 if np.shares_memory(tensor.numpy(), batch) else None),
        (side_l, "ppo_update: valid steps (all valid here: a view)",
         lambda: flat[slice(None) if bool(mask.all()) else mask.nonzero().squeeze(1)], None),
        (side_l, "ppo_update: valid steps when some are not (index positions)",
         lambda: flat[mask.nonzero().squeeze(1)], None),
    ]
    rows, out = [], []
    for side, name, fn, known in stages:
        seconds = _time(fn, repeats) if fn is not None else None
        if name.startswith("learner._to_batch") and seconds is not None:
            seconds /= 2  # the concatenate copies both fragments
        copies = seconds / memcpy if seconds is not None else known
        out.append({"side": side, "stage": name, "ms": None if seconds is None else
                    seconds * 1e3, "memcpy_equivalents": copies,
                    "measured": fn is not None})
        rows.append([side, name, "-" if seconds is None else f"{seconds * 1e3:.2f}",
                     "-" if copies is None else f"{copies:.2f}" + ("" if fn else " (source)")])
    common.print_table(
        f"Copy census: one fragment with {obs.nbytes / 2**20:.0f} MiB of observations "
        f"(memcpy of it: {memcpy * 1e3:.2f} ms; median of {repeats})",
        ["side", "step", "ms", "memcpy-equivalents (time / memcpy)"], rows)
    return [{"memcpy_ms": memcpy * 1e3, "bytes": obs.nbytes}, *out]


if __name__ == "__main__":
    torch.set_num_threads(1)
    run()
