"""Settings of the learner process: the algorithm's hyperparameters and its connections.

Each field is documented once here; `hetrl learner`, `hetrl local` and job
hyperparameters are generated from these dataclasses. No torch or grpc imports.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Literal

from hetrl.rollout.settings import (
    EnvSettings,
    PolicySettings,
    ReliabilitySettings,
    _chain_post_init,
    require,
)


def auto_fragments_per_batch(connected_workers: int, credits: int, target_lag: float = 2.0
                             ) -> int:
    """Fragments per batch that keep the mean policy lag near `target_lag` updates.

    When the learner is the bottleneck, every worker keeps `credits` fragments in flight,
    so a fragment waits behind about workers x credits others; consumed `n` per update,
    it is about workers x credits / n updates old when trained. (2 workers x 2 credits:
    2 fragments per batch, hetrl's old default; 14 workers: 14.)
    """
    return max(1, math.ceil(max(connected_workers, 1) * credits / target_lag))


@dataclasses.dataclass
class TrainSettings:
    """PPO / V-trace hyperparameters and the learner's flow control."""

    total_steps: int = 300_000
    """Env steps (all workers together) to train for."""
    preset: Literal["auto", "none", "classic", "continuous", "atari"] = "auto"
    """Settings preset for the env's family, applied by `hetrl local` / `hetrl launch` /
    `run_local` to every setting you do not give: auto picks from the env's spaces
    (an Atari game: atari, else by the actions: Box continuous, others classic); none keeps the
    shipped defaults (tuned on CartPole). The run's settings.json records the one applied."""
    learning_rate: float = 1e-3
    """Adam learning rate at the start."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to zero over --total-steps."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """Trace-cutting lambda of V-trace (equals GAE's lambda when on-policy)."""
    fragments_per_batch: int | Literal["auto"] = "auto"
    """Fragments (from any workers) in one training batch; auto: enough that the mean
    policy lag stays near --target-policy-lag updates with the workers connected x
    --credits-per-worker (lag 2: 2 workers get 2, 14 workers 14), so a bigger cluster
    gets bigger batches."""
    target_policy_lag: float = 2.0
    """Mean policy lag (updates) that --fragments-per-batch auto aims for: lower means
    bigger batches and fresher experience, fewer updates per env step."""
    synchronous: bool = False
    """PPO's synchronous loop (CleanRL's, SB3's): a fragment's credit comes back only
    once the batch it is in has trained, so every fragment is sampled with the newest
    weights (policy lag 0) and the workers wait while the learner trains. The batch is
    every credit of every connected worker; --target-policy-lag no longer applies."""
    epochs: int = 4
    """Passes over each batch."""
    minibatches: int = 4
    """Minibatches per epoch."""
    clip_coef: float = 0.2
    """PPO clipping of the ratio between the new policy and the one --clip-against names."""
    clip_against: Literal["behaviour", "learner"] = "behaviour"
    """The policy PPO's ratio is taken against. behaviour: the one that sampled each
    step (APPO as Sample Factory runs it); a step sampled some updates back can sit
    outside the clip range before the update starts and then gives no gradient.
    learner: the learner's policy as the update starts (decoupled PPO, Hilton et al.
    2022), each step weighted by min(--vtrace-rho-clip, learner / behaviour
    probability): policy lag no longer costs gradient. At lag 0 the same update, but
    for the observation normaliser's own move as the update starts."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    value_clip: float = 0.0
    """Clip the value loss as PPO's original code, CleanRL (clip_vloss, at the clip
    coefficient) and SB3 (clip_range_vf) can: the larger of the squared errors of the
    new value and of the value as the update starts moved at most this far; 0: off."""
    max_grad_norm: float = 0.5
    """Gradient norm clip."""
    advantages: Literal["vtrace", "gae"] = "gae"
    """Policy-gradient advantage: gae is vs - V, which on-policy is GAE(--gae-lambda),
    what PPO uses, still trace-corrected for policy lag; vtrace is IMPALA's
    r + gamma * vs' - V (a full one-step return past the first step: more variance)."""
    vtrace_rho_clip: float = 1.0
    """V-trace clip of importance weights in the value targets (rho bar)."""
    vtrace_c_clip: float = 1.0
    """V-trace clip of the trace coefficients (c bar)."""
    reward_scale: float = 1.0
    """Multiply rewards by this before training (e.g. 0.1 for Pendulum)."""
    max_policy_lag: int = 10
    """Fragments from weights older than this many updates are dropped and counted."""
    credits_per_worker: int = 2
    """Fragments each worker may run ahead of the learner (bounds memory and lag)."""
    device: str = "auto"
    """Torch device for training: auto picks cuda when available, else cpu."""
    gradients: Literal["auto", "autograd"] = "auto"
    """How the update takes gradients: auto writes them out by hand in numpy for the
    built-in MLP policy on CPU (the same loss, about 3x faster per update; see
    learner/mlp_ppo.py) and uses torch autograd for anything else; autograd always
    uses torch autograd."""
    learner_torch_threads: int = 1
    """Torch CPU threads of the learner (when training on CPU)."""

    def __post_init__(self) -> None:
        require(self.total_steps > 0, f"--total-steps must be > 0, got {self.total_steps}")
        require(self.learning_rate > 0, "--learning-rate must be > 0")
        require(self.target_policy_lag > 0,
                f"--target-policy-lag must be > 0, got {self.target_policy_lag}")
        require(0 <= self.gamma <= 1, "--gamma must be in [0, 1]")
        require(0 <= self.gae_lambda <= 1, "--gae-lambda must be in [0, 1]")
        if isinstance(self.fragments_per_batch, str) and self.fragments_per_batch != "auto":
            require(self.fragments_per_batch.isdigit(),
                    f"--fragments-per-batch must be auto or a number >= 1, "
                    f"got {self.fragments_per_batch!r}")
            self.fragments_per_batch = int(self.fragments_per_batch)
        for name in ("fragments_per_batch", "epochs", "minibatches", "credits_per_worker",
                     "learner_torch_threads"):
            if name == "fragments_per_batch" and self.fragments_per_batch == "auto":
                continue
            value = getattr(self, name)
            require(value >= 1, f"--{name.replace('_', '-')} must be >= 1, got {value}")
        require(self.max_policy_lag >= 0, "--max-policy-lag must be >= 0")
        require(self.clip_coef > 0, "--clip-coef must be > 0")
        require(self.value_clip >= 0, "--value-clip must be >= 0 (0: off)")
        require(self.advantages in ("vtrace", "gae"), "--advantages must be vtrace or gae")
        require(self.clip_against in ("behaviour", "learner"),
                "--clip-against must be behaviour or learner")
        require(self.gradients in ("auto", "autograd"), "--gradients must be auto or autograd")
        require(not self.synchronous or self.fragments_per_batch == "auto",
                "--synchronous trains on every credit of every worker at once (the batch "
                "is workers x --credits-per-worker fragments): leave --fragments-per-batch "
                "at auto and size the batch with --credits-per-worker or --envs-per-worker")
        _chain_post_init(self, TrainSettings)

    def batch_fragments(self, workers: int) -> int:
        """Fragments per training batch with `workers` workers connected: the number
        given, or (auto) what keeps the mean policy lag near --target-policy-lag, or
        (--synchronous) every credit of every worker."""
        if self.synchronous:
            return max(1, workers) * self.credits_per_worker
        if self.fragments_per_batch == "auto":
            return auto_fragments_per_batch(workers, self.credits_per_worker,
                                            self.target_policy_lag)
        return int(self.fragments_per_batch)


@dataclasses.dataclass
class OutputSettings:
    """Where a run writes its metrics and model."""

    out: str = ""
    """Output directory: metrics.jsonl, TensorBoard events, model.safetensors. Empty: a new
    runs/<env>__seed<seed>__<date-time> for every run. A run refuses a directory that holds
    files unless --resume (continue it) or --overwrite (start it again) is given."""
    metrics_every: float = 2.0
    """Seconds between rows of metrics.jsonl and TensorBoard; each row averages the
    updates since the last one and the episodes that ended in them. 0: a row after every
    update (the curve's finest grain, and the most bytes on a long job)."""
    progress: bool = True
    """Show progress: a bar with percent, steps/s, ETA, return and lag on a terminal, a
    line every few seconds otherwise."""
    track: bool = False
    """Also log to Weights & Biases (CleanRL's --track; pip install 'hetrl[track]'); the
    run is named after its output directory."""
    wandb_project: str = "hetrl"
    """Weights & Biases project (with --track)."""
    wandb_entity: str = ""
    """Weights & Biases entity (team or user; empty: your default)."""

    def __post_init__(self) -> None:
        require(self.metrics_every >= 0, "--metrics-every must be >= 0 (0: every update)")
        _chain_post_init(self, OutputSettings)


def default_run_dir(env: str, seed: int, root: str = "runs") -> str:
    """A new output directory per run, named as CleanRL and SB3 users expect:
    runs/<env>__seed<seed>__<YYYYmmdd-HHMMSS> (the env made filename-safe)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", env).strip("-.") or "env"
    return f"{root}/{name}__seed{seed}__{time.strftime('%Y%m%d-%H%M%S')}"

@dataclasses.dataclass
class CheckpointSettings:
    """Where and how often the learner checkpoints, and whether it resumes."""

    checkpoint_dir: str = ""
    """Checkpoint directory; empty means <out>/checkpoints."""
    checkpoint_every: float = 300.0
    """Seconds between periodic checkpoints; one is also written at the end and on a stop."""
    keep_checkpoints: int = 3
    """Newest checkpoints kept; older ones are deleted."""
    resume: bool = False
    """Resume from the newest readable checkpoint in --checkpoint-dir, if there is one."""

    def __post_init__(self) -> None:
        require(self.checkpoint_every > 0, "--checkpoint-every must be > 0")
        require(self.keep_checkpoints >= 1, "--keep-checkpoints must be >= 1")
        _chain_post_init(self, CheckpointSettings)


@dataclasses.dataclass
class EvalSettings:
    """Periodic evaluation during training, by a separate process on spare CPU."""

    eval_every: int = 0
    """Env steps between evaluations of the current policy (whole episodes of a fresh
    env), logged as charts/eval_return; 0: none."""
    eval_episodes: int = 10
    """Whole episodes per evaluation."""
    eval_deterministic: bool = True
    """Evaluate the policy's most likely action; --no-eval-deterministic samples actions
    as training does (for envs where the most likely action loops, e.g. MiniGrid's)."""

    def __post_init__(self) -> None:
        require(self.eval_every >= 0, "--eval-every must be >= 0 (0: no evaluation)")
        require(self.eval_episodes >= 1, "--eval-episodes must be >= 1")
        _chain_post_init(self, EvalSettings)


@dataclasses.dataclass
class LearnerSettings(EnvSettings, PolicySettings, TrainSettings, CheckpointSettings,
                      OutputSettings, ReliabilitySettings, EvalSettings):
    """The learner process: connects to workers and trains."""

    worker_addresses: tuple[str, ...] = ()
    """host:port of every rollout worker."""
    addresses_file: str = ""
    """Instead of --worker-addresses: wait for this JSON file (its launcher bounds the wait),
    {"addresses": [...]}, which a launcher writes once its workers listen, so that the
    learner's start-up (its imports) overlaps the workers'."""
    finishing_file: str = ""
    """If set, the learner creates this file as it stops training (before it stops its
    workers), so a supervisor restarts no worker from then on."""
    connect_timeout: float = 120.0
    """Seconds to keep retrying a worker that is not reachable yet (names resolving late,
    workers starting) before giving up on it."""
    stop_reason_file: str = ""
    """If set, a stop by signal reads why from this file when it exists (a launcher that
    ends the run because a worker cannot go on writes the cause there first); the run
    then counts as failed, with that cause as its outcome."""
    write_settings: bool = True
    """Write these settings to <out>/settings.json; a launcher that writes its whole
    command's settings there instead (workers, envs per worker, ...) turns this off."""
    learners: int = 1
    """Learner processes (ranks) that train this one policy together, data parallel
    (learner/group.py); each takes its share of --worker-addresses."""
    rank: int = 0
    """This learner's rank in the group, 0 to --learners - 1 (rank 0 writes the outputs)."""
    rendezvous: str = ""
    """Where a group's ranks meet: host:port where rank 0 listens, or file:///path (a
    file all ranks can reach on one machine: no port at all)."""
    own_worker_addresses: tuple[str, ...] = ()
    """In a group: workers only this rank streams from (its host's own, on loopback),
    besides its share of --worker-addresses."""

    def __post_init__(self) -> None:
        self.worker_addresses = tuple(self.worker_addresses)
        self.own_worker_addresses = tuple(self.own_worker_addresses)
        require(self.learners >= 1, f"--learners must be >= 1, got {self.learners}")
        require(0 <= self.rank < self.learners,
                f"--rank must be in 0..{self.learners - 1}, got {self.rank}")
        require(self.learners == 1 or bool(self.rendezvous),
                "--learners > 1 needs --rendezvous (where the ranks meet)")
        require(len(self.worker_addresses) + len(self.own_worker_addresses) > 0
                or bool(self.addresses_file),
                "give at least one --worker-addresses host:port")
        require(self.connect_timeout > 0, "--connect-timeout must be > 0")
        _chain_post_init(self, LearnerSettings)
