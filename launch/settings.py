"""Settings of the launcher roles. Fields are documented once; the CLI comes from here."""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar, Literal

import tyro

from hetrl.learner.settings import (
    CheckpointSettings,
    EvalSettings,
    OutputSettings,
    TrainSettings,
)
from hetrl.rollout.settings import (
    EnvSettings,
    PolicySettings,
    ReliabilitySettings,
    RolloutSettings,
    _chain_post_init,
    require,
)


def flags_given(args: list[str], cls: type) -> set[str]:
    """Names of the fields of `cls` that command-line `args` set (`--name value`,
    `--name=value`, and `--no-name` for booleans)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    given = set()
    for arg in args:
        name = arg[2:].partition("=")[0].replace("-", "_") if arg.startswith("--") else ""
        if name not in fields and name.startswith("no_"):
            name = name[3:]
        if name in fields:
            given.add(name)
    return given


@dataclasses.dataclass
class LocalRunSettings:
    """How many workers a local run starts, and how it supervises them."""

    workers: int = 2
    """Rollout worker processes (one per spare core is a good start)."""
    learners: int = 1
    """Learner processes training one policy together, data parallel (a learner group:
    one per GPU, or CPU processes over gloo); each trains on its share of the workers,
    and their gradients are averaged at every minibatch. Needs --workers >= --learners."""
    startup_timeout: float = 120.0
    """Seconds a worker may take to start listening before the run is abandoned."""
    shutdown_grace: float = 20.0
    """Seconds children get to exit after training ends or a stop, before SIGKILL."""
    connect_timeout: float = 120.0
    """Seconds the learner keeps retrying a worker whose stream broke before it counts
    the worker lost for good (the summary lists it with its fragments in flight)."""
    instance_type: str = ""
    """Instance type this machine stands for in the run report's cost figures
    (e.g. ml.g5.2xlarge); empty: no cost figures."""
    overwrite: bool = False
    """Start again in an --out that holds a previous hetrl run, deleting its outputs
    (hetrl never deletes a directory that no run of its wrote)."""
    report: bool = True
    """Write the run report (report/report.md and its plots) when training ends;
    --no-report skips it (`hetrl report RUN` writes it later)."""

    def __post_init__(self) -> None:
        require(self.workers >= 1, f"--workers must be >= 1, got {self.workers}")
        require(self.learners >= 1, f"--learners must be >= 1, got {self.learners}")
        require(self.workers >= self.learners,
                f"--learners {self.learners} needs at least as many --workers (each rank "
                f"trains on its own), got {self.workers}")
        require(self.connect_timeout > 0, "--connect-timeout must be > 0")
        require(self.startup_timeout > 0, "--startup-timeout must be > 0")
        require(self.shutdown_grace > 0, "--shutdown-grace must be > 0")
        _chain_post_init(self, LocalRunSettings)


# Bases in reverse of the order their flags are listed (a dataclass collects the last
# base's fields first): the env and the run first, then the algorithm, the rollout,
# checkpoints and outputs, and the fault and transport settings last.
@dataclasses.dataclass
class LocalSettings(
    ReliabilitySettings, OutputSettings, CheckpointSettings, EvalSettings, RolloutSettings,
    TrainSettings, PolicySettings, LocalRunSettings, EnvSettings,
):
    """`hetrl local`: rollout workers and a learner as separate processes on this machine."""

    def __post_init__(self) -> None:
        _chain_post_init(self, LocalSettings)


@dataclasses.dataclass
class ClusterSettings(
    EnvSettings, PolicySettings, RolloutSettings, TrainSettings, EvalSettings, CheckpointSettings,
    OutputSettings, ReliabilitySettings,
):
    """`hetrl launch`: the one entry point of every host of a SageMaker (or emulated) job.

    The job's hyperparameters map onto these fields (same names as the flags)."""

    hidden_flags: ClassVar[tuple[str, ...]] = ("out",)  # a job writes into its model dir

    env_groups: tuple[str, ...] = ("env_group",)
    """Instance groups whose hosts run rollout workers (more than one is allowed)."""
    learner_group: str = "learner_group"
    """Instance group whose hosts run the learner: one host, or several that train one
    policy together (a learner group, one rank per GPU: see --learners-per-host)."""
    learners_per_host: int = 0
    """Learner ranks on each learner host; 0: one per GPU (one on a host without). More
    than one rank in all makes a data-parallel learner group (NCCL on GPUs, gloo on CPU)."""
    group_port: int = 7010
    """Port where rank 0 of a learner group (on the first learner host in natural name
    order) meets the other ranks; open between the learner hosts only."""
    workers_per_env_host: int = 0
    """Rollout workers on each env host; 0 starts one per usable core."""
    learner_host_workers: int = -1
    """Rollout workers on the learner host too; -1 uses the cores left after
    --learner-cores, 0 runs none."""
    learner_cores: int = 2
    """Cores the learner host keeps for the learner when it also runs workers."""
    control_port: int = 7000
    """Port of each env host's control service (stop, describe, heartbeat)."""
    worker_base_port: int = 7100
    """Worker i of a host listens on worker_base_port + i."""
    first_heartbeat_timeout: float = 900.0
    """Env host: seconds to wait for the learner's first heartbeat before failing."""
    loss_timeout: float = 120.0
    """Env host: seconds without a learner heartbeat before failing (dead-man's switch)."""
    resolve_timeout: float = 600.0
    """Learner host: seconds to keep retrying name resolution and connects to env hosts."""
    stop_budget: float = 60.0
    """Seconds in which a stop (end of training, SIGTERM) must complete on every host: the
    learner's final checkpoint, then every env host stopped (half of it), then the run
    report if time is left. SageMaker SIGKILLs 120 s after its SIGTERM; the other 60 s
    are margin for the checkpoint's S3 sync (a SIGTERM stop measured 13 s in all, see
    docs/reliability.md)."""
    checkpoint_dir: str = "/opt/ml/checkpoints"
    """Where the learner writes checkpoints (SageMaker syncs this directory with S3)."""
    resume: bool = True
    """Resume from the newest checkpoint there (a restarted spot job continues)."""
    checkpoint_every: float = 120.0
    """Seconds between periodic checkpoints. Shorter than for local runs: a host killed
    without its SIGTERM (a lost instance) resumes from the newest periodic checkpoint."""

    def __post_init__(self) -> None:
        self.env_groups = tuple(self.env_groups)
        require(len(self.env_groups) >= 1, "--env-groups needs at least one group name")
        require(self.learner_group not in self.env_groups,
                "--learner-group must differ from every --env-groups name")
        require(self.workers_per_env_host >= 0, "--workers-per-env-host must be >= 0")
        require(self.learner_host_workers >= -1, "--learner-host-workers must be >= -1")
        require(self.learner_cores >= 1, "--learner-cores must be >= 1")
        require(self.learners_per_host >= 0, "--learners-per-host must be >= 0 (0: one per GPU)")
        for name in ("control_port", "worker_base_port", "group_port"):
            value = getattr(self, name)
            require(0 < value < 65536, f"--{name.replace('_', '-')} must be a port, got {value}")
        for name in ("first_heartbeat_timeout", "loss_timeout", "resolve_timeout",
                     "stop_budget"):
            value = getattr(self, name)
            require(value > 0, f"--{name.replace('_', '-')} must be > 0, got {value}")
        _chain_post_init(self, ClusterSettings)


@dataclasses.dataclass
class InstanceTypes:
    """The two instance types of a heterogeneous job (submit, emulate and plan size one)."""

    env_type: str = "ml.c5.9xlarge"
    """Instance type of the env hosts (rollout workers)."""
    learner_type: str = "ml.g5.2xlarge"
    """Instance type of the learner hosts."""
    learner_count: int = 1
    """Instances in the learner group; more than one train one policy together (a
    learner group: one rank per GPU of each, data parallel)."""

    def __post_init__(self) -> None:
        require(1 <= self.learner_count <= 64,
                f"--learner-count must be in [1, 64], got {self.learner_count}")
        for name in ("env_type", "learner_type"):
            value = getattr(self, name)
            require(value.startswith("ml."),
                    f"--{name.replace('_', '-')} must be a SageMaker instance type like "
                    f"ml.c5.9xlarge, got {value!r}")
        _chain_post_init(self, InstanceTypes)


@dataclasses.dataclass
class ReportSettings:
    """`hetrl report RUN_DIR [RUN_B]`: write a run's report, or compare two runs."""

    runs: Annotated[tuple[str, ...], tyro.conf.Positional]
    """One run directory to report on, or two (A then B) to compare."""
    instance_type: tuple[str, ...] = ()
    """Instance type each local run stands for, in the order of the runs (cluster runs
    record their own)."""
    prices: str = ""
    """A JSON price file overriding the shipped table (same format as launch/prices.json),
    or `live` / `live:REGION` for current prices from the AWS Price List API (needs AWS
    credentials; cached a day; the shipped table, with a line saying so, without)."""
    target_return: float | None = None
    """Comparing two runs: the mean return(100) whose env steps, wall time and cost to
    reach are compared; default: the lower of the two runs' best."""

    def __post_init__(self) -> None:
        require(len(self.runs) in (1, 2), "give one run directory, or two to compare")
        require(len(self.instance_type) <= len(self.runs),
                "give at most one --instance-type per run")


@dataclasses.dataclass
class EnjoySettings:
    """`hetrl enjoy RUN`: play a trained policy and print its returns (optionally film it)."""

    run: Annotated[str, tyro.conf.Positional]
    """A run directory (an emulated job's folder works too) or a model file; the env and
    network come from the model."""
    which: Literal["best", "final"] = "best"
    """The run's best policy (model-best.safetensors: by training return, or by evaluation
    with --eval-every), or its final one; best falls back to final when the run kept none."""
    episodes: int = 10
    """Whole episodes to play."""
    deterministic: bool = False
    """Take the most likely action (argmax, or the Gaussian's mean) instead of sampling."""
    seed: int = 0
    """Episode i is reset with seed + i."""
    video: str = ""
    """Record every episode as an mp4 into this directory (needs moviepy: hetrl[video])."""

    def __post_init__(self) -> None:
        require(self.episodes >= 1, f"--episodes must be >= 1, got {self.episodes}")
