"""Benchmark 4, learner throughput: env samples per second the learner can train on.

Runs hetrl's real learner step on synthetic batches shaped like the env's fragments,
in this process, without workers: `np.concatenate` of `fragments_per_batch` fragments
and `torch.from_numpy` (as `Learner._to_batch`), one `learner.ppo.ppo_update` (V-trace
targets, `epochs` x `minibatches` PPO steps, default `TrainSettings`), and the weights
message pushed to workers (`wire.encode_named(policy_arrays(...))`). Samples/s =
env steps in the batch / seconds of that step; each sample is visited `epochs` times,
so gradient samples/s is `epochs` times higher. Models: the default MLP (64, 64) on
Humanoid-v5 and CartPole-v1 observations and `bench.nets:SmallCNN` on (4, 84, 84) uint8
Pong frames and the built-in Nature CNN that Atari runs train, each with 1 torch thread
(hetrl's default) and with every core; then a MuJoCo run's update (HalfCheetah-v5's
spaces, the continuous preset: 2,048 steps, 10 epochs x 32 minibatches, one thread)
with the numpy update of the built-in MLP (`learner/mlp_ppo.py`) and with torch's
autograd (`--gradients autograd`), the A/B of what the numpy update buys.
Run: `python -m bench.learner_throughput [--quick]`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import tyro

from bench import common
from hetrl.launch.presets import apply_preset
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.ppo import Batch, ppo_update
from hetrl.learner.settings import TrainSettings
from hetrl.protos import hetrl_pb2
from hetrl.rollout import wire
from hetrl.rollout.envs import action_dtype
from hetrl.rollout.fragments import STEP_FIELDS
from hetrl.rollout.policy import Policy, policy_arrays
from hetrl.rollout.settings import PolicySettings

MODELS = {
    "mlp / Humanoid-v5": (gym.spaces.Box(-np.inf, np.inf, (348,), np.float64),
                          gym.spaces.Box(-0.4, 0.4, (17,), np.float32), ""),
    "mlp / HalfCheetah-v5": (gym.spaces.Box(-np.inf, np.inf, (17,), np.float64),
                             gym.spaces.Box(-1.0, 1.0, (6,), np.float32), ""),
    "mlp / CartPole-v1": (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                          gym.spaces.Discrete(2), ""),
    "cnn / Pong 4x84x84 u8": (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
                              gym.spaces.Discrete(6), "bench.nets:SmallCNN"),
    # the built-in network for pixels (ImageActorCritic, the Nature CNN), as --atari trains
    "nature cnn / Pong 4x84x84 u8": (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
                                     gym.spaces.Discrete(6), ""),
}


@dataclasses.dataclass
class Settings:
    """Learner throughput: samples/s of hetrl's PPO/V-trace update on CPU."""

    models: tuple[str, ...] = ("mlp / Humanoid-v5", "mlp / CartPole-v1", "cnn / Pong 4x84x84 u8",
                               "nature cnn / Pong 4x84x84 u8")
    """Which of the built-in model/observation pairs to run (also: mlp / HalfCheetah-v5)."""
    preset: Literal["none", "classic", "continuous", "atari"] = "none"
    """Update settings of this preset instead of the shipped defaults (`continuous`: what
    a MuJoCo run trains with, 4 fragments = 2,048 steps, 10 epochs x 32 minibatches)."""
    repeats: int = 5
    """Timed learner steps per configuration (after one warm-up step)."""
    threads: tuple[int, ...] = (1, 0)
    """torch threads to try; 0 means every usable core."""
    autograd_ab: bool = True
    """Also time a MuJoCo run's update (mlp / HalfCheetah-v5, continuous preset, one
    thread) with the numpy update and with autograd."""
    fragment_length: int = 64
    """T of each synthetic fragment."""
    envs_per_worker: int = 8
    """N of each synthetic fragment."""
    seed: int = 1
    """Seed of the synthetic data and the network."""
    quick: bool = False
    """One timed step per configuration, 1 thread only."""


def fragments(obs_space, act_space, s: Settings, count: int, rng) -> list[dict]:
    t, n = s.fragment_length, s.envs_per_worker
    out = []
    for _ in range(count):
        if obs_space.dtype == np.uint8:
            obs = rng.integers(0, 256, (t + 1, n, *obs_space.shape), dtype=np.uint8)
        else:
            obs = rng.standard_normal((t + 1, n, *obs_space.shape)).astype(obs_space.dtype)
        if isinstance(act_space, gym.spaces.Discrete):
            actions = rng.integers(0, act_space.n, (t, n)).astype(action_dtype(act_space))
        else:
            actions = rng.standard_normal((t, n, *act_space.shape)).astype(np.float32)
        out.append({
            "observations": obs, "actions": actions,
            "logprobs": rng.standard_normal((t, n)).astype(np.float32) - 1.0,
            "rewards": rng.standard_normal((t, n)).astype(np.float32),
            "terminated": rng.random((t, n)) < 0.01, "truncated": np.zeros((t, n), bool),
            "valid": rng.random((t, n)) > 0.01,
        })
    return out


def learner_step(policy, optimizer, frags, cfg: TrainSettings) -> dict[str, float]:
    """What Learner._to_batch + _train do per batch, minus metrics and the network."""
    t0 = time.perf_counter()

    def stack(name: str) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([f[name] for f in frags], axis=1))

    # feed-forward fragments carry no recurrent fields (starts, initial_state)
    batch = Batch(**{name: stack(name) for name in STEP_FIELDS if name in frags[0]})
    t1 = time.perf_counter()
    stats = ppo_update(policy, optimizer, batch, cfg)
    t2 = time.perf_counter()
    hetrl_pb2.Weights(version=1, arrays=wire.encode_named(policy_arrays(policy)))
    t3 = time.perf_counter()
    return {"to_batch": t1 - t0, "update": t2 - t1, "weights": t3 - t2, "total": t3 - t0,
            "samples": stats["charts/samples_trained"],
            "steps": float(batch.rewards.numel())}


def update_settings(s: Settings) -> TrainSettings:
    return apply_preset(TrainSettings(preset=s.preset), explicit=())[0]


def label(r: dict) -> str:
    """A row's name in tables and the suite's summary: model, threads, autograd A/B."""
    preset = f", {r['preset']} preset" if r.get("preset", "none") != "none" else ""
    ab = ", autograd" if r.get("gradients") == "autograd" else ""
    return f"{r['model']}{preset} ({r['torch_threads']} thr{ab})"


def measure(name: str, threads: int, s: Settings, cfg: TrainSettings) -> dict:
    obs_space, act_space, net = MODELS[name]
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    torch.manual_seed(s.seed)
    policy = Policy(obs_space, act_space, PolicySettings(policy=net))
    optimizer = PolicyAdam(policy, cfg.learning_rate)
    rng = np.random.default_rng(s.seed)
    runs = []
    for i in range(s.repeats + 1):
        frags = fragments(obs_space, act_space, s, cfg.batch_fragments(2), rng)
        result = learner_step(policy, optimizer, frags, cfg)
        if i:  # the first step is a warm-up
            runs.append(result)
    steps = runs[0]["steps"]
    return {
        "model": name, "torch_threads": torch.get_num_threads(), "preset": cfg.preset,
        "gradients": cfg.gradients,
        "batch_env_steps": steps, "epochs": cfg.epochs, "minibatches": cfg.minibatches,
        "samples_per_s": common.summarize([r["steps"] / r["total"] for r in runs]),
        "update_only_samples_per_s": common.summarize([r["steps"] / r["update"] for r in runs]),
        "gradient_samples_per_s": common.summarize(
            [r["samples"] * cfg.epochs / r["update"] for r in runs]),
        "to_batch_ms": common.summarize([r["to_batch"] * 1e3 for r in runs]),
        "weights_encode_ms": common.summarize([r["weights"] * 1e3 for r in runs]),
        "step_ms": common.summarize([r["total"] * 1e3 for r in runs]),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, repeats=1, threads=(1,))
    cfg = update_settings(s)
    results = []
    for name in s.models:
        for threads in s.threads:
            print(f"measuring {name}, {threads or 'all'} thread(s) ...", flush=True)
            results.append(measure(name, threads, s, cfg))
    if s.autograd_ab:
        mujoco = update_settings(dataclasses.replace(s, preset="continuous"))
        for gradients in ("auto", "autograd"):
            print(f"measuring a MuJoCo update, gradients {gradients} ...", flush=True)
            results.append(measure("mlp / HalfCheetah-v5", 1, s,
                                   dataclasses.replace(mujoco, gradients=gradients)))
    common.print_table(
        f"Learner throughput on CPU: env samples/s of one learner step "
        f"(preset {s.preset}: batch {cfg.batch_fragments(2)} x {s.fragment_length} x "
        f"{s.envs_per_worker}, {cfg.epochs} epochs x "
        f"{cfg.minibatches} minibatches; median [min-max] of {s.repeats})",
        ["model (threads)", "samples/s (whole step)", "update only", "gradient samples/s",
         "step ms", "to_batch ms", "weights ms"],
        [[label(r), common.fmt(r["samples_per_s"]),
          common.fmt(r["update_only_samples_per_s"]), common.fmt(r["gradient_samples_per_s"]),
          common.fmt(r["step_ms"], ".1f"), common.fmt(r["to_batch_ms"], ".2f"),
          common.fmt(r["weights_encode_ms"], ".2f")] for r in results])
    common.write_json("learner_throughput", s, results)
    return results


if __name__ == "__main__":
    main()
