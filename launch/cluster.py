"""What this host is in its training job, read the way SageMaker defines it.

`read_cluster` wraps `sagemaker_training.environment.Environment` (which reads
`$SAGEMAKER_BASE_DIR/input/config/resourceconfig.json` and `hyperparameters.json`); it
uses the `current_instance_group` property, never `get_current_instance_group()`, which
raises KeyError on real configs, and never the SM_*GROUP* variables, which the v3 SDK
leaves unset. `settings_from_hyperparameters` maps the job's hyperparameters onto
ClusterSettings with a clear error for unknown or malformed ones. `resolve` turns a
host name into an address, retrying because names resolve late in a fresh cluster.
No processes are started here.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import socket
import time
import types
import typing
from pathlib import Path
from typing import Any, Literal

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


def read_cluster() -> ClusterView:
    """Read the job's resource config and hyperparameters.

    Raises:
        ConfigError: sagemaker-training is not installed, or the config cannot be read.
    """
    try:
        from sagemaker_training import environment
    except ImportError as exc:
        raise ConfigError(
            "hetrl launch reads the cluster with the sagemaker-training package: "
            "pip install 'hetrl[cluster]' (SageMaker's PyTorch images already have it)"
        ) from exc
    try:
        env = environment.Environment()
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(
            f"cannot read the SageMaker config under {environment.base_dir}: {exc!r}. "
            "Outside SageMaker, use hetrl local or hetrl emulate."
        ) from exc
    groups = {
        name: list(group.get("hosts", []))
        for name, group in (env.instance_groups_dict or {}).items()
    }
    types = {
        name: group.get("instance_type", "")
        for name, group in (env.instance_groups_dict or {}).items()
    }
    current_group = env.current_instance_group or ""
    if not groups:  # a homogeneous job has no instance groups: treat it as one group
        current_group = current_group or "homogeneous"
        groups = {current_group: list(env.hosts)}
    return ClusterView(
        current_host=env.current_host,
        current_group=current_group,
        groups=groups,
        instance_types=types,
        is_hetero=bool(env.is_hetero),
        base_dir=Path(environment.base_dir),
        model_dir=Path(env.model_dir),
        output_dir=Path(env.output_dir),
        num_cpus=int(env.num_cpus),
        num_gpus=int(env.num_gpus),
        hyperparameters=dict(env.hyperparameters),
    )


def _convert(key: str, raw: Any, kind: Any) -> Any:
    """Convert one hyperparameter (already JSON-decoded where it could be) to `kind`."""
    origin = typing.get_origin(kind)
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("true", "1", "yes"):
                return True
            if text in ("false", "0", "no"):
                return False
            raise ValueError("expected true or false")
        if kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError("expected an integer")
            return int(raw)
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError("expected a number")
            return float(raw)
        if kind is str:
            return raw if isinstance(raw, str) else json.dumps(raw)
        if origin is Literal:
            if raw not in typing.get_args(kind):
                raise ValueError(f"expected one of {typing.get_args(kind)}")
            return raw
        if origin in (typing.Union, types.UnionType):  # e.g. int | Literal["auto"]
            errors = []
            for option in typing.get_args(kind):
                try:
                    return _convert(key, raw, option)
                except ConfigError as exc:
                    errors.append(str(exc).split(" is malformed: ", 1)[-1])
            raise ValueError("; ".join(errors))
        if origin is tuple:
            item_kind = typing.get_args(kind)[0]
            if isinstance(raw, str):
                raw = json.loads(raw) if raw.strip().startswith("[") else raw.split(",")
            if not isinstance(raw, list):
                raw = [raw]
            return tuple(_convert(key, item, item_kind) for item in raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"hyperparameter {key}={raw!r} is malformed: {exc}") from exc
    raise ConfigError(f"hyperparameter {key}: unsupported type {kind}")


def settings_overrides(hyperparameters: dict[str, Any], cls: type) -> dict[str, Any]:
    """Map job hyperparameters onto field values of the settings class `cls`.

    Keys may use underscores or dashes (`total_steps`, `total-steps`); SageMaker's own
    `sagemaker_*` keys are ignored.

    Raises:
        ConfigError: an unknown key (with the nearest known names) or a malformed value.
    """
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, raw in hyperparameters.items():
        if key.startswith("sagemaker_"):
            continue
        name = key.replace("-", "_")
        if name not in names:
            near = difflib.get_close_matches(name, sorted(names), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ConfigError(f"unknown hyperparameter {key!r}{hint}")
        values[name] = _convert(key, raw, hints[name])
    return values


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
