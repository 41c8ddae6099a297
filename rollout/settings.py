"""Settings shared by every process role, and those of a rollout worker.

Settings are plain dataclasses; each field is documented once, in the docstring under
it, and the CLI (`hetrl ...`) and job hyperparameters are generated from them. Role
settings are built by inheriting the groups they need, so a flag means the same thing
everywhere. Validation lives in `__post_init__`, which chains through the mixins.
This module must not import torch, grpc or gymnasium: it is read by every entry point.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, TypeVar

from hetrl.rollout.errors import ConfigError

T = TypeVar("T")


def _chain_post_init(obj: object, cls: type) -> None:
    parent = getattr(super(cls, obj), "__post_init__", None)
    if parent is not None:
        parent()


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition holds."""
    if not condition:
        raise ConfigError(message)


@dataclasses.dataclass
class EnvSettings:
    """Which environment to simulate."""

    env: str = "CartPole-v1"
    """Gymnasium id (e.g. Humanoid-v5) or an entry point `my_pkg.my_mod:MyEnv`."""
    env_import: tuple[str, ...] = ()
    """Modules to import before making the env (they register custom ids)."""
    seed: int = 1
    """Seed of envs, policy init and sampling; each worker derives its own from it."""
    drop_observations: tuple[str, ...] = ()
    """Keys of a Dict observation to drop before hetrl sees them (e.g. `mission`,
    MiniGrid's text, which no policy can read); every process drops them alike."""
    atari: bool = False
    """The standard Atari pipeline on an ALE env (the atari preset turns it on for
    ALE/* ids): 1 to --atari-noop-max no-ops after a reset, --atari-frame-skip frames
    per step with the last two max-pooled, grayscale --atari-screen-size squares, FIRE
    after a reset where the game waits for it, --atari-frame-stack frames stacked. The
    same env in training, evaluation and `hetrl enjoy`; episodic life and reward
    clipping act on training only (--episodic-life, --clip-rewards)."""
    atari_noop_max: int = 30
    """Most no-op steps after a reset (--atari); 0: none."""
    atari_frame_skip: int = 4
    """Emulator frames per agent step (--atari), the last two max-pooled."""
    atari_screen_size: int = 84
    """Side of the grayscale square each frame is resized to (--atari)."""
    atari_frame_stack: int = 4
    """Frames stacked into one observation, newest last (--atari); 1: no stack."""
    atari_sticky_actions: float = 0.25
    """Chance the emulator repeats the previous action on each frame (--atari; ALE v5's
    default, Machado et al. 2018); 0: deterministic."""

    def __post_init__(self) -> None:
        require(bool(self.env.strip()), "--env must name a gymnasium id or module:Class")
        for name in ("atari_frame_skip", "atari_screen_size", "atari_frame_stack"):
            value = getattr(self, name)
            require(value >= 1, f"--{name.replace('_', '-')} must be >= 1, got {value}")
        require(self.atari_noop_max >= 0, "--atari-noop-max must be >= 0")
        require(0 <= self.atari_sticky_actions <= 1, "--atari-sticky-actions must be in [0, 1]")
        self.env_import = tuple(self.env_import)
        self.drop_observations = tuple(self.drop_observations)
        _chain_post_init(self, EnvSettings)


@dataclasses.dataclass
class PolicySettings:
    """The policy network; worker and learner build the same one from these."""

    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the hidden layers of the default MLP (separate actor and critic)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Activation of the default MLP."""
    policy: str = ""
    """Custom torch module `my_pkg.my_mod:MyNet`, called as MyNet(observation_space,
    action_space); forward(obs) returns (head [B, k], value [B]): k logits for Discrete(k),
    sum(nvec) for MultiDiscrete (one block per choice), n for MultiBinary(n), the means of
    the flattened action for a Box. Empty: the MLP."""
    normalize_observations: bool = True
    """Normalize float observations with running mean/std kept in the policy's buffers
    (uint8 observations are scaled to [0, 1] instead)."""
    recurrent: Literal["none", "lstm", "gru"] = "none"
    """A memory for partly observed envs: an LSTM or GRU core between the built-in
    network's encoder and its actor and critic heads. Workers (and central inference)
    carry each env's hidden state, zeroed at every episode start; each fragment carries
    its starting state, and the learner replays the fragment as a sequence (truncated
    BPTT over --fragment-length steps)."""
    rnn_size: int = 128
    """Width of the recurrent core (--recurrent lstm or gru)."""
    inference: Literal["worker", "central"] = "worker"
    """Where actions are chosen: worker (each worker runs a CPU copy of the policy and
    sends whole fragments; weights go out after every update) or central (workers only
    step their envs, in two groups taking turns, and send observations; the learner runs
    one batched forward pass for all of them on its device, answers with actions and
    builds the fragments itself; no weights travel). `hetrl plan` says which is faster
    for your env and policy."""

    def __post_init__(self) -> None:
        require(self.inference in ("worker", "central"),
                f"--inference must be worker or central, got {self.inference!r}")
        require(self.recurrent in ("none", "lstm", "gru"),
                f"--recurrent must be none, lstm or gru, got {self.recurrent!r}")
        require(self.rnn_size > 0, f"--rnn-size must be positive, got {self.rnn_size}")
        require(self.recurrent == "none" or not self.policy,
                "--recurrent builds hetrl's own network around a memory; a custom --policy "
                "is called as a feed-forward module: leave out one of the two")
        self.hidden_sizes = tuple(self.hidden_sizes)
        # Empty would build a linear policy; a bare --hidden-sizes gives it silently, so it
        # is refused (a linear policy is a custom --policy).
        require(len(self.hidden_sizes) >= 1,
                "--hidden-sizes needs at least one width, e.g. --hidden-sizes 64 64")
        require(
            all(h > 0 for h in self.hidden_sizes),
            f"--hidden-sizes must be positive, got {self.hidden_sizes}",
        )
        require(
            not self.policy or ":" in self.policy,
            f"--policy must look like my_pkg.my_mod:MyNet, got {self.policy!r}",
        )
        _chain_post_init(self, PolicySettings)


@dataclasses.dataclass
class RolloutSettings:
    """How each worker steps its envs."""

    envs_per_worker: int = 8
    """Environments in each worker's vector env (N)."""
    fragment_length: int = 64
    """Steps per env in one fragment (T); a fragment holds T x N transitions."""
    vector_mode: Literal["auto", "sync", "async"] = "auto"
    """Gymnasium vectorization: auto uses the env's own vector implementation when it
    ships one (CartPole does) and sync otherwise; async runs one subprocess per env."""
    worker_torch_threads: int = 1
    """Torch CPU threads per worker; one is right when a worker gets one core."""
    normalize_rewards: bool = True
    """Train on rewards divided by the running std of each worker's discounted returns
    (then clipped to +-reward_clip); reported episode returns stay raw. It keeps the
    critic's loss near 1 whatever the reward scale: on raw returns (CartPole's reach
    ~100) that loss dominates the gradient-norm clip and starves the policy's step."""
    reward_clip: float = 10.0
    """Clip of normalised rewards (with --normalize-rewards); 0: no clip."""
    reward_norm_gamma: float = 0.99
    """Discount of the returns whose std scales the rewards (--normalize-rewards); keep it
    equal to --gamma."""
    clip_rewards: bool = False
    """Train on the sign of each reward (-1, 0 or 1; DQN's Atari reward clipping, on by
    the atari preset); reported episode returns stay in the game's own score."""
    episodic_life: bool = False
    """A lost life ends the value target (terminal for training) while the game goes
    on, for envs that report `lives` in their info (ALE envs; on by the atari preset);
    episodes, reported returns and evaluation stay whole games."""

    def __post_init__(self) -> None:
        for name in ("envs_per_worker", "fragment_length", "worker_torch_threads"):
            value = getattr(self, name)
            require(value >= 1, f"--{name.replace('_', '-')} must be >= 1, got {value}")
        require(self.reward_clip >= 0, "--reward-clip must be >= 0 (0: no clip)")
        require(0 <= self.reward_norm_gamma <= 1, "--reward-norm-gamma must be in [0, 1]")
        _chain_post_init(self, RolloutSettings)


@dataclasses.dataclass
class ReliabilitySettings:
    """How a process reacts to faults: failing envs, hangs, non-finite data, lost peers."""

    env_failure_rate: float = 0.25
    """Failure budget of each env, as a rate: when more than this fraction of one env's
    last --env-failure-window steps failed (raised, or returned NaN/Inf), its worker
    reports unhealthy and exits. Rarer faults are survived however long the run: the
    env is recreated, its episode dropped and the fault counted."""
    env_failure_window: int = 100
    """Steps (per env) over which --env-failure-rate is measured."""
    step_timeout: float = 120.0
    """Seconds one vector step or reset may take before the worker's watchdog declares the
    env hung and exits (code 5) so its supervisor restarts it."""
    nonfinite: Literal["drop", "fail"] = "drop"
    """NaN/Inf in observations, rewards or weights: drop the episode (or fragment, or
    weights) and count it, or fail fast."""
    keepalive_time: float = 10.0
    """Seconds between gRPC keepalive pings on every connection, both directions."""
    keepalive_timeout: float = 10.0
    """Seconds a ping may go unanswered before the peer is declared gone; a silent peer
    is detected within keepalive_time + keepalive_timeout."""

    def __post_init__(self) -> None:
        require(0 < self.env_failure_rate < 1, "--env-failure-rate must be in (0, 1)")
        require(self.env_failure_window >= 1, "--env-failure-window must be >= 1")
        require(self.step_timeout > 0, "--step-timeout must be > 0")
        require(self.nonfinite in ("drop", "fail"), "--nonfinite must be drop or fail")
        require(self.keepalive_time >= 1, "--keepalive-time must be >= 1 s")
        require(self.keepalive_timeout >= 1, "--keepalive-timeout must be >= 1 s")
        _chain_post_init(self, ReliabilitySettings)


@dataclasses.dataclass
class WorkerSettings(EnvSettings, PolicySettings, RolloutSettings, ReliabilitySettings):
    """A rollout worker process: a gRPC server the learner connects to."""

    worker_id: int = 0
    """Index of this worker; with --seed it picks the env seeds."""
    host: str = "127.0.0.1"
    """Address to bind. Loopback by default; a cluster binds its own interface."""
    port: int = 0
    """Port to bind; 0 picks a free one (written to --ready-file)."""
    ready_file: str = ""
    """If set, the bound address is written here (JSON) once the server listens."""
    progress_file: str = ""
    """If set, written (JSON) when this process first delivers experience to the learner
    and every few seconds after: its supervisor restarts a worker that dies only while
    its incarnations keep delivering."""
    learner_timeout: float = 300.0
    """Seconds without a learner stream (at start or after one ends) before the worker
    gives up and exits non-zero, so no worker outlives its learner."""

    def __post_init__(self) -> None:
        require(self.worker_id >= 0, "--worker-id must be >= 0")
        require(0 <= self.port < 65536, f"--port must be in [0, 65535], got {self.port}")
        require(self.learner_timeout > 0, "--learner-timeout must be > 0")
        _chain_post_init(self, WorkerSettings)


SNAPSHOT_GLOB = "step-*.safetensors"  # periodic evaluation: what the learner leaves
RESULTS_FILE = "results.jsonl"  # and what the evaluator appends, one line per evaluation


@dataclasses.dataclass
class EvaluatorSettings:
    """The evaluator process: plays every new policy snapshot the learner leaves in
    --eval-dir and appends the returns to results.jsonl there."""

    eval_dir: str = ""
    """Folder the learner writes snapshots into (<out>/eval)."""
    eval_episodes: int = 10
    """Whole episodes per evaluation."""
    seed: int = 1
    """Episode i of every evaluation is reset with seed + i (the same episodes each time)."""
    deterministic: bool = True
    """Play the most likely action; False: sample, as training does."""

    def __post_init__(self) -> None:
        require(bool(self.eval_dir), "--eval-dir must name a folder")
        require(self.eval_episodes >= 1, "--eval-episodes must be >= 1")


def pick(cls: type[T], source: object, **overrides: Any) -> T:
    """Build settings `cls` from the same-named fields of `source`, then apply overrides."""
    values = {
        f.name: getattr(source, f.name)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if hasattr(source, f.name)
    }
    values.update(overrides)
    return cls(**values)


def to_json(settings: object) -> str:
    """Serialize settings for a child process (JSON, never pickle)."""
    return json.dumps(dataclasses.asdict(settings))  # type: ignore[call-overload]


def from_json(cls: type[T], text: str) -> T:
    """Inverse of to_json; unknown keys are an error so typos never pass silently."""
    values = json.loads(text)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown settings for {cls.__name__}: {', '.join(unknown)}")
    return cls(**values)
