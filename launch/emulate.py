"""`hetrl emulate`: a heterogeneous SageMaker job rehearsed on one machine.

For each emulated host it writes the tree SageMaker would give it
(`input/config/resourceconfig.json` with unsorted group host lists,
`hyperparameters.json`, `inputdataconfig.json`, `model/`, `output/`), maps `algo-N` to
its own loopback address 127.0.0.N (HETRL_HOST_MAP), and starts the very entry point a
real host runs (`python -m hetrl.launch.host`) with SAGEMAKER_BASE_DIR pointing at its tree
and the shared token in its environment. Every host's lines, prefixed `[host role]`,
reach one stream (the terminal), as a job's do in CloudWatch, and each host's host.log.
It then watches the hosts as SageMaker would:
the job succeeds when every host exits 0. Ctrl-C sends SIGTERM to every host, as a
job stop does. It does not train anything itself.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, TextIO

from hetrl.launch.cluster import HOST_MAP_ENV, host_order
from hetrl.launch.hyperparameters import to_hyperparameters
from hetrl.launch.processes import PYTHON, Child, child_environment, spawn_command, stop_all
from hetrl.launch.settings import ClusterSettings, InstanceTypes
from hetrl.rollout.errors import ConfigError
from hetrl.rollout.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from hetrl.rollout.settings import require
from hetrl.rollout.transport import new_token

# Fields that describe the emulation, not the job: never passed as hyperparameters.
_NOT_HYPERPARAMETERS = {"out", "progress", "control_port", "worker_base_port"}


@dataclasses.dataclass
class EmulateSettings(InstanceTypes, ClusterSettings):
    """`hetrl emulate`: run a heterogeneous job's hosts as processes on this machine."""

    hidden_flags: ClassVar[tuple[str, ...]] = ()  # --out: where the emulated hosts live

    env_hosts: int = 2
    """Emulated env hosts (the env group's instance count)."""
    workers_per_env_host: int = 2
    """Rollout workers on each emulated env host."""
    learner_host_workers: int = 0
    """Rollout workers on the emulated learner host (one machine has no spare cores)."""
    checkpoint_dir: str = ""
    """Checkpoints of the emulated learner host; empty: <out>/hosts/<learner>/checkpoints."""

    def __post_init__(self) -> None:
        require(1 <= self.env_hosts <= 200,
                f"--env-hosts must be in [1, 200], got {self.env_hosts}")
        super().__post_init__()


@dataclasses.dataclass
class EmulateResult:
    """Exit code of every emulated host, and what the failing ones wrote."""

    exit_code: int
    out: Path
    learner_host: str
    exit_codes: dict[str, int | None]
    failures: dict[str, str]
    learner_hosts: tuple[str, ...] = ()
    """Every learner host (rank 0's, `learner_host`, first)."""

    @property
    def summary(self) -> dict[str, Any]:
        path = self.out / "hosts" / self.learner_host / "model" / "summary.json"
        return json.loads(path.read_text()) if path.exists() else {}


def _layout(settings: EmulateSettings) -> tuple[list[str], list[str]]:
    """Learner hosts and env hosts, named like SageMaker and deliberately unsorted (the
    learner group's too: its ranks follow the natural order, not the listed one)."""
    hosts = [f"algo-{i}" for i in range(1, settings.env_hosts + settings.learner_count + 1)]
    learners = hosts[1 : 1 + settings.learner_count][::-1]  # numbers say nothing of groups
    env_hosts = [h for h in hosts if h not in learners][::-1]
    return learners, env_hosts


def _free_port_block(addresses: list[str], size: int) -> int:
    """A port p such that p .. p+size-1 are free on every address."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + size >= 65000:
            continue
        try:
            for address in addresses:
                for port in range(base, base + size):
                    with socket.socket() as s:
                        s.bind((address, port))
        except OSError:
            continue
        return base
    raise ConfigError("no free block of ports on the emulated loopback addresses")


def build_trees(settings: EmulateSettings, root: Path
                ) -> tuple[list[str], list[str], dict[str, str]]:
    """Write every host's SageMaker tree under root/hosts; return (learner hosts, rank
    0's first, env hosts, host map)."""
    learners, env_hosts = _layout(settings)
    all_hosts = sorted([*learners, *env_hosts], key=host_order)
    learners = sorted(learners, key=host_order)
    host_map = {h: f"127.0.0.{h.split('-')[1]}" for h in all_hosts}
    base_port = _free_port_block(list(host_map.values()), settings.workers_per_env_host + 2)
    checkpoint_dir = settings.checkpoint_dir or str(root / "hosts" / learners[0] / "checkpoints")
    hyperparameters = to_hyperparameters(settings, leave_out=_NOT_HYPERPARAMETERS)
    hyperparameters.update({key: json.dumps(value) for key, value in {
        "control_port": base_port,
        "worker_base_port": base_port + 1,
        "group_port": base_port + settings.workers_per_env_host + 1,
        "checkpoint_dir": checkpoint_dir,
        "env_groups": list(settings.env_groups),
        "learner_group": settings.learner_group,
    }.items()})
    env_group = settings.env_groups[0]
    groups = [
        {"instance_group_name": env_group, "instance_type": settings.env_type, "hosts": env_hosts},
        {"instance_group_name": settings.learner_group, "instance_type": settings.learner_type,
         "hosts": _layout(settings)[0]},
    ]
    for host in all_hosts:
        base = root / "hosts" / host
        config = base / "input" / "config"
        config.mkdir(parents=True, exist_ok=True)
        for sub in ("model", "output", "input/data"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        (base / "output" / "failure").unlink(missing_ok=True)
        is_learner = host in learners
        resource = {
            "current_host": host,
            "current_group_name": settings.learner_group if is_learner else env_group,
            "current_instance_type": settings.learner_type if is_learner else settings.env_type,
            "hosts": all_hosts,
            "instance_groups": groups,
            "network_interface_name": "lo",
        }
        (config / "resourceconfig.json").write_text(json.dumps(resource, indent=2))
        (config / "hyperparameters.json").write_text(json.dumps(hyperparameters, indent=2))
        (config / "inputdataconfig.json").write_text("{}")
    return learners, env_hosts, host_map


@dataclasses.dataclass
class EmulatedCluster:
    """One emulated job: its trees, and the host processes started so far."""

    root: Path
    learner: str
    """The learner host of rank 0 (the first in natural order): the run's outputs."""
    env_hosts: list[str]
    hosts: dict[str, Child]
    environment: dict[str, str] = dataclasses.field(default_factory=dict)
    """Environment every host starts with: the job's token and the host map."""
    learner_log: Path | None = None
    """Where the learner host's output goes; None: its host.log with `echo`, else this
    process's terminal."""
    echo: TextIO | None = None
    """Where every host's lines also go, as one stream (each line is prefixed `[host
    role]` by the host itself), as CloudWatch shows a job's hosts."""
    learners: list[str] = dataclasses.field(default_factory=list)
    """Every learner host (a learner group's), rank 0's first."""


def prepare_hosts(settings: EmulateSettings, learner_log: Path | None = None,
                  echo: TextIO | None = None) -> EmulatedCluster:
    """Write every host's tree and the job's environment; start nothing."""
    root = Path(settings.out).resolve()
    learners, env_hosts, host_map = build_trees(settings, root)
    environment = child_environment(new_token())
    environment[HOST_MAP_ENV] = ",".join(f"{h}={a}" for h, a in host_map.items())
    return EmulatedCluster(root, learners[0], env_hosts, {}, environment, learner_log, echo,
                           learners=learners)


def start_host(cluster: EmulatedCluster, host: str, wrapper: tuple[str, ...] = (),
               command: tuple[str, ...] = (), environment: dict[str, str] | None = None,
               ) -> Child:
    """Start one host's entry point on its tree, as SageMaker starts it (or starts it
    again, as a replaced instance would: same tree, same token, same address).
    `wrapper` is a command that runs the entry point (e.g. `ip netns exec NS`); `command`
    replaces the entry point itself (e.g. the job's sm_train.sh), and `environment` is
    added to the host's."""
    env = {**cluster.environment, "SAGEMAKER_BASE_DIR": str(cluster.root / "hosts" / host),
           **(environment or {})}
    # The learner host's log is the run's progress: show it; env hosts log to files.
    log_path: Path | None = cluster.root / "hosts" / host / "host.log"
    if host == cluster.learner and (cluster.learner_log or cluster.echo is None):
        log_path = cluster.learner_log
    command = (*wrapper, *(command or (*PYTHON, "-m", "hetrl.launch.host")))
    child = spawn_command(host, list(command), env, log_path, echo=cluster.echo)
    cluster.hosts[host] = child
    return child


def start_hosts(settings: EmulateSettings, learner_log: Path | None = None,
                echo: TextIO | None = None) -> EmulatedCluster:
    """Write the trees and start every host's entry point (env hosts first)."""
    cluster = prepare_hosts(settings, learner_log, echo)
    for host in [*cluster.env_hosts, *cluster.learners]:
        start_host(cluster, host)
    return cluster


def run_emulated(settings: EmulateSettings) -> EmulateResult:
    """Run every emulated host to the end; the job's exit code is 0 only if all hosts' are."""

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, on_signal)
    code = EXIT_OK
    cluster: EmulatedCluster | None = None
    try:
        # One stream, as CloudWatch shows; progress, so on stderr (the result: stdout).
        cluster = start_hosts(settings, echo=sys.stderr)
        hosts = cluster.hosts
        while hosts[cluster.learner].exit_code() is None:
            time.sleep(0.2)
        deadline = time.monotonic() + settings.stop_budget + settings.loss_timeout
        while time.monotonic() < deadline and any(c.exit_code() is None for c in hosts.values()):
            time.sleep(0.1)
    except KeyboardInterrupt:
        print("\nhetrl emulate: stopping every host (SIGTERM, as a job stop does)",
              file=sys.stderr)
        if cluster is not None:
            stop_all(list(cluster.hosts.values()), settings.stop_budget)
        code = EXIT_INTERRUPTED
    finally:
        if cluster is not None:
            stop_all(list(cluster.hosts.values()), 5.0)  # kills only what outlived its budget
        signal.signal(signal.SIGTERM, previous)
    if cluster is None:
        raise ConfigError("the emulated cluster did not start")
    return collect_result(cluster, code)


def collect_result(cluster: EmulatedCluster, code: int = EXIT_OK) -> EmulateResult:
    """Exit codes and failure files of every host (after they have exited)."""
    codes = {name: child.exit_code() for name, child in cluster.hosts.items()}
    failures = {}
    for name in cluster.hosts:
        failure = cluster.root / "hosts" / name / "output" / "failure"
        if failure.exists():
            failures[name] = failure.read_text()
    if code == EXIT_OK and any(c != 0 for c in codes.values()):
        code = EXIT_FAILED
    return EmulateResult(code, cluster.root, cluster.learner, codes, failures,
                         tuple(cluster.learners or [cluster.learner]))


def report(result: EmulateResult) -> str:
    """A short table of hosts, exit codes and failure reasons."""
    lines = [f"{'host':<10} {'role':<8} {'exit':>4}  failure"]
    for host, code in result.exit_codes.items():
        role = "learner" if host in (result.learner_hosts or (result.learner_host,)) else "env"
        reason = result.failures.get(host, "").splitlines()[0:1]
        lines.append(f"{host:<10} {role:<8} {code!s:>4}  {reason[0] if reason else ''}")
    return "\n".join(lines)
