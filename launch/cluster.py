"""What this host is in its training job, read the way SageMaker defines it.

`read_cluster` wraps `sagemaker_training.environment.Environment` (which reads
`$SAGEMAKER_BASE_DIR/input/config/resourceconfig.json` and `hyperparameters.json`); it
uses the `current_instance_group` property, never `get_current_instance_group()`, which
raises KeyError on real configs, and never the SM_*GROUP* variables, which the v3 SDK
leaves unset. Where the toolkit is not installed (an sdist needing gcc, so absent from
custom images), `read_cluster_files` reads the same two files the same way
(launch/hyperparameters.py turns the hyperparameters into settings). `resolve` turns a
host name into an address, retrying because names resolve late in a fresh cluster.
No processes are started here (but nvidia-smi, to count GPUs without the toolkit).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from hetrl.rollout.errors import ConfigError

# "algo-1=127.0.0.1,algo-2=127.0.0.2": consulted before DNS (hetrl emulate sets it).
HOST_MAP_ENV = "HETRL_HOST_MAP"


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """This host's view of the job."""

    current_host: str
    current_group: str
    groups: dict[str, list[str]]  # group name -> hosts, in the order the config gives
    instance_types: dict[str, str]
    is_hetero: bool
    base_dir: Path
    model_dir: Path
    output_dir: Path
    num_cpus: int
    num_gpus: int
    hyperparameters: dict[str, Any]
    network_interface: str = ""
    """The interface the job's hosts reach each other on (resourceconfig.json's
    network_interface_name; eth0 on SageMaker), where a learner group's ranks talk."""

    def hosts_of(self, group_names: tuple[str, ...]) -> list[str]:
        """Hosts of the named groups (unsorted, as configured; duplicates removed)."""
        hosts: list[str] = []
        for name in group_names:
            for host in self.groups.get(name, []):
                if host not in hosts:
                    hosts.append(host)
        return hosts

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"


SAGEMAKER_BASE_DIR = "/opt/ml"
"""Root of a host's SageMaker tree, unless $SAGEMAKER_BASE_DIR says otherwise."""
HOMOGENEOUS = "homogeneousCluster"
"""The group name SageMaker's toolkit gives a job without instance groups."""


def read_cluster() -> ClusterView:
    """Read the job's resource config and hyperparameters: with the sagemaker-training
    toolkit where it is installed (SageMaker's own images), else straight from the files.

    Raises:
        ConfigError: the config cannot be read.
    """
    try:
        from sagemaker_training import environment
    except ImportError:  # an sdist that needs gcc: absent from many custom images
        return read_cluster_files()
    try:
        env = environment.Environment()
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(
            f"cannot read the SageMaker config under {environment.base_dir}: {exc!r}. "
            "Outside SageMaker, use hetrl local or hetrl emulate."
        ) from exc
    return _view(
        current_host=env.current_host,
        current_group=env.current_instance_group or "",
        group_configs=list((env.instance_groups_dict or {}).values()),
        hosts=list(env.hosts),
        is_hetero=bool(env.is_hetero),
        base_dir=Path(environment.base_dir),
        num_cpus=int(env.num_cpus),
        num_gpus=int(env.num_gpus),
        hyperparameters=dict(env.hyperparameters),
        network_interface=str(getattr(env, "network_interface_name", "") or ""),
    )


def read_cluster_files(base_dir: Path | None = None) -> ClusterView:
    """`read_cluster` without the toolkit: `<base>/input/config/resourceconfig.json` and
    `hyperparameters.json` read as the toolkit reads them (values JSON-decoded where they
    parse, `sagemaker_*` keys left out, the group from `current_group_name`).

    Raises:
        ConfigError: a file is missing or malformed.
    """
    base = Path(base_dir or os.environ.get("SAGEMAKER_BASE_DIR", SAGEMAKER_BASE_DIR))
    config = base / "input" / "config"
    try:
        resource = json.loads((config / "resourceconfig.json").read_text())
        raw = json.loads((config / "hyperparameters.json").read_text())
        groups = list(resource.get("instance_groups") or [])
        current_host, hosts = resource["current_host"], list(resource["hosts"])
        names = [group["instance_group_name"] for group in groups]
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"cannot read the SageMaker config under {base}: {exc!r}. "
            "Outside SageMaker, use hetrl local or hetrl emulate."
        ) from exc
    hyperparameters = {}
    for key, value in raw.items():
        if key.startswith("sagemaker_"):
            continue
        try:
            hyperparameters[key] = json.loads(value)
        except (TypeError, ValueError):
            hyperparameters[key] = value
    return _view(
        current_host=current_host,
        current_group=resource.get("current_group_name", HOMOGENEOUS),
        group_configs=groups,
        hosts=hosts,
        is_hetero=len(names) > 1,
        base_dir=base,
        num_cpus=os.cpu_count() or 1,
        num_gpus=_count_gpus(),
        hyperparameters=hyperparameters,
        # The toolkit's default where the file names none.
        network_interface=str(resource.get("network_interface_name") or "eth0"),
    )


def _view(*, current_host: str, current_group: str, group_configs: list[dict[str, Any]],
          hosts: list[str], is_hetero: bool, base_dir: Path, num_cpus: int, num_gpus: int,
          hyperparameters: dict[str, Any], network_interface: str = "") -> ClusterView:
    groups = {g["instance_group_name"]: list(g.get("hosts", [])) for g in group_configs}
    types = {g["instance_group_name"]: g.get("instance_type", "") for g in group_configs}
    if not groups:  # a homogeneous job has no instance groups: treat it as one group
        current_group = current_group or "homogeneous"
        groups = {current_group: hosts}
    return ClusterView(
        current_host=current_host,
        current_group=current_group,
        groups=groups,
        instance_types=types,
        is_hetero=is_hetero,
        base_dir=base_dir,
        model_dir=base_dir / "model",
        output_dir=base_dir / "output",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        hyperparameters=hyperparameters,
        network_interface=network_interface,
    )


def host_order(host: str) -> tuple:
    """Natural order of host names: algo-2 before algo-10 (every host of a job sorts
    them the same way, whatever order its resourceconfig.json lists them in)."""
    return tuple(int(part) if part.isdigit() else part
                 for part in re.split(r"(\d+)", host))


def _count_gpus() -> int:
    """GPUs nvidia-smi lists (0 without it), as the toolkit counts them."""
    try:
        listing = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True,
                                 text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def parse_host_map(text: str) -> dict[str, str]:
    """Parse HETRL_HOST_MAP ("name=address,...")."""
    mapping = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, address = item.partition("=")
        if not sep or not name or not address:
            raise ConfigError(f"{HOST_MAP_ENV}: {item!r} is not name=address")
        mapping[name] = address
    return mapping


def resolve(host: str, timeout: float) -> str:
    """The IPv4 address of `host`, retrying for up to `timeout` s (names appear late).

    Raises:
        ConfigError: the name did not resolve in time.
    """
    mapped = parse_host_map(os.environ.get(HOST_MAP_ENV, "")).get(host)
    if mapped:
        return mapped
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        try:
            return socket.gethostbyname(host)
        except OSError as exc:
            if time.monotonic() + delay > deadline:
                raise ConfigError(
                    f"cannot resolve host {host!r} within {timeout:.0f} s: {exc}"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def usable_cores() -> int:
    """Cores this process may run on (respects CPU affinity and container limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
