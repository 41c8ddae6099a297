"""Update-only throughput of a learner group: samples/s per rank with 1 rank and with N.

Each rank is a process (spawned) that joins a `LearnerGroup` through a file store, as
`hetrl local --learners N` does, builds the policy of --net (mlp: Humanoid-v5's spaces
and the 64x64 MLP; cnn: 4 stacked 84x84 frames, 6 actions, the built-in CNN), one fixed
synthetic batch of --envs x --steps steps, and times --updates PPO updates
(`ppo_update_async` with the group: every minibatch's gradient all-reduced) after two of
warm-up. Reported per rank count: each rank's samples/s, the group's, and the
all-reduce seconds per update; nothing else runs (no env, no gRPC), so this is the
learner's ceiling and what the group costs it. On CUDA each rank takes GPU rank %
device_count: where ranks outnumber GPUs they share one, which NCCL refuses; that count
is then skipped with a line saying so. Run: `python -m bench.group_updates` (CPU, gloo),
`--device cuda` on a GPU machine (bench/gpu_check.sh, ONLY=learner_group); `--quick`
is the MLP with 1 and 2 ranks and few updates.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Literal

import tyro

from bench import common


@dataclasses.dataclass
class Settings:
    """Update-only samples/s per rank for 1 rank and for each of --ranks."""

    net: tuple[Literal["mlp", "cnn"], ...] = ("mlp", "cnn")
    """Networks to time (mlp: Humanoid-v5 spaces; cnn: 4x84x84 frames, 6 actions)."""
    ranks: tuple[int, ...] = (1, 2)
    """Group sizes to time."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where each rank trains (cuda: gloo for the turns, NCCL for the gradients)."""
    envs: int = 32
    """Envs per batch (one rank's batch: every rank trains a batch this size)."""
    steps: int = 64
    """Steps per env in the batch."""
    updates: int = 10
    """Timed updates per rank (after 2 of warm-up)."""
    quick: bool = False
    """The MLP only, 3 updates: a smoke run, nothing committed."""


def _spaces(net: str):
    import gymnasium as gym
    import numpy as np

    if net == "mlp":
        return (gym.spaces.Box(-np.inf, np.inf, (348,), np.float64),
                gym.spaces.Box(-0.4, 0.4, (17,), np.float32))
    return gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6)


def _rank(rank: int, ranks: int, store: str, s: Settings, net: str,
          results: multiprocessing.Queue) -> None:
    import torch

    from hetrl.learner.group import LearnerGroup
    from hetrl.learner.optimizer import PolicyAdam
    from hetrl.learner.ppo import Batch, read_stats
    from hetrl.learner.ppo import ppo_update_async as update
    from hetrl.learner.settings import TrainSettings
    from hetrl.rollout.observations import tree_map
    from hetrl.rollout.policy import Policy
    from hetrl.rollout.settings import PolicySettings

    try:
        torch.set_num_threads(1)
        device = torch.device("cuda", rank % torch.cuda.device_count()) \
            if s.device == "cuda" else torch.device("cpu")
        group = LearnerGroup(rank, ranks, f"file://{store}", device, timeout=120) \
            if ranks > 1 else None
        obs_space, act_space = _spaces(net)
        policy = Policy(obs_space, act_space, PolicySettings()).to(device)
        optimizer = PolicyAdam(policy, 3e-4)
        cfg = TrainSettings()  # the shipped 4 epochs x 4 minibatches
        t_len, n = s.steps, s.envs
        obs = policy.obs_layout.sample(obs_space, (t_len + 1) * n)
        actions, _ = policy.act(tree_map(lambda o: o[: t_len * n], obs))
        flags = {k: torch.zeros(t_len, n, dtype=torch.bool, device=device)
                 for k in ("terminated", "truncated")}
        batch = Batch(
            observations=tree_map(lambda o: torch.from_numpy(
                o.reshape(t_len + 1, n, *o.shape[1:])).to(device), obs),
            actions=torch.from_numpy(actions.reshape(t_len, n, *actions.shape[1:])).to(device),
            logprobs=torch.full((t_len, n), -0.7, device=device),
            rewards=torch.randn(t_len, n, device=device),
            valid=torch.ones(t_len, n, dtype=torch.bool, device=device),
            valid_count=t_len * n, **flags)
        for _ in range(2):
            read_stats(update(policy, optimizer, batch, cfg, group))
        if group is not None:
            group.agree({})  # start the clock together
            group.reduce_seconds, group.reduces = 0.0, 0
        start = time.perf_counter()
        for _ in range(s.updates):
            read_stats(update(policy, optimizer, batch, cfg, group))  # one sync per update
        seconds = time.perf_counter() - start
        results.put({"rank": rank, "samples_per_s": s.updates * t_len * n / seconds,
                     "update_seconds": seconds / s.updates,
                     "allreduce_seconds_per_update":
                         group.reduce_seconds / s.updates if group is not None else 0.0})
        if group is not None:
            group.close()
    except Exception as exc:  # noqa: BLE001 - reported as the run's outcome
        results.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"[:500]})


def time_group(s: Settings, net: str, ranks: int) -> dict:
    """Spawn `ranks` rank processes and collect what each measured."""
    import torch

    if s.device == "cuda" and ranks > max(torch.cuda.device_count(), 1):
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): say so, skip.
        return {"net": net, "ranks": ranks, "skipped":
                f"{ranks} ranks on {torch.cuda.device_count()} GPU(s): NCCL runs one rank "
                "per GPU, so this group needs a machine with more GPUs"}
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = str(Path(folder) / "store")
        processes = [context.Process(target=_rank, args=(r, ranks, store, s, net, results))
                     for r in range(ranks)]
        for process in processes:
            process.start()
        got = sorted((results.get(timeout=600) for _ in processes), key=lambda r: r["rank"])
        for process in processes:
            process.join(60)
    errors = [r["error"] for r in got if "error" in r]
    if errors:
        return {"net": net, "ranks": ranks, "error": errors[0]}
    return {"net": net, "ranks": ranks,
            "samples_per_s_per_rank": [round(r["samples_per_s"], 1) for r in got],
            "samples_per_s_group": round(sum(r["samples_per_s"] for r in got), 1),
            "update_seconds": round(max(r["update_seconds"] for r in got), 5),
            "allreduce_seconds_per_update": round(
                max(r["allreduce_seconds_per_update"] for r in got), 5)}


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, net=("mlp",), ranks=(1, 2), updates=3, envs=8)
    runs = [time_group(s, net, ranks) for net in s.net for ranks in s.ranks]
    rows = []
    for r in runs:
        if "samples_per_s_group" not in r:
            rows.append([r["net"], r["ranks"], "-", "-", "-", r.get("skipped") or r["error"]])
            continue
        single = next((x for x in runs if x["net"] == r["net"] and x["ranks"] == 1
                       and "samples_per_s_group" in x), None)
        scaling = (f"{r['samples_per_s_group'] / single['samples_per_s_group']:.2f}x"
                   if single else "-")
        share = r["allreduce_seconds_per_update"] / max(r["update_seconds"], 1e-12)
        rows.append([r["net"], r["ranks"],
                     " / ".join(f"{v:,.0f}" for v in r["samples_per_s_per_rank"]),
                     f"{r['samples_per_s_group']:,.0f}", f"{share:.0%}", scaling])
    common.print_table(
        f"Learner group, update only ({s.device}, {s.envs} envs x {s.steps} steps per rank's "
        "batch, 4 epochs x 4 minibatches)",
        ["net", "ranks", "samples/s per rank", "group samples/s",
         "all-reduce share of an update", "vs 1 rank"], rows)
    results = {"runs": runs}
    common.write_json("group_updates", s, results)
    if not s.quick and s.device == "cpu":
        common.write_json("summary_group_updates", s, results)
    return results


if __name__ == "__main__":
    main()
