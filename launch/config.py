"""Settings files: `--config FILE`, and the settings.json a run leaves to be rerun or resumed.

A run's settings.json holds every setting of the command that made it (a local run's
`LocalSettings`, a job's `ClusterSettings`), so `--config runs/X/settings.json` reruns
the same run in a new directory, and `--resume` continues the run in --out as it was:
its saved settings fill every setting the command line does not give. What shapes the
network and the env (RESUME_FIXED) cannot change on a resume; a command that asks for
it is refused before anything starts. This module reads and compares settings only; it
starts nothing and imports neither torch nor gRPC.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from hetrl.launch.hyperparameters import from_hyperparameters
from hetrl.launch.settings import ClusterSettings, LocalSettings
from hetrl.learner.settings import LearnerSettings
from hetrl.rollout.errors import ConfigError, OutputError
from hetrl.rollout.settings import WorkerSettings

ROLE_SETTINGS = (LocalSettings, ClusterSettings, LearnerSettings, WorkerSettings)

SETTINGS_FILE = "settings.json"

# What a checkpoint's network and observation statistics depend on: a resume keeps them.
RESUME_FIXED = ("env", "env_import", "drop_observations", "atari", "atari_frame_skip",
                "atari_screen_size", "atari_frame_stack", "hidden_sizes", "activation",
                "policy", "normalize_observations", "recurrent", "rnn_size")
# Settings about the directory, not the run: a rerun from a run's own file drops them.
_DIRECTORY_SETTINGS = ("out", "resume", "overwrite")


def _read(path: Path) -> dict[str, Any]:
    """The mapping in a JSON or YAML file.

    Raises:
        ConfigError: it cannot be read or parsed, or holds no mapping.
    """
    try:
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc})") from exc
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path}: expected a mapping of setting: value")
    return values


def config_values(path: str, cls: type) -> dict[str, Any]:
    """Field values of `cls` from a JSON or YAML settings file.

    Settings of other hetrl roles that `cls` lacks (a job's settings.json holds the
    cluster's, e.g. control_port) are skipped. A run's own settings.json (its `out` is the
    file's folder) drops `out`, `resume` and `overwrite`, so the rerun gets a directory
    of its own and never writes into the run it copies.

    Raises:
        ConfigError: the file cannot be read or parsed, or names an unknown setting.
    """
    file = Path(path)
    values = {k.replace("-", "_"): v for k, v in _read(file).items()}
    if values.get("out") and Path(values["out"]).resolve() == file.parent.resolve():
        for name in _DIRECTORY_SETTINGS:
            values.pop(name, None)
    own = {f.name for f in dataclasses.fields(cls)}
    known = {f.name for c in ROLE_SETTINGS for f in dataclasses.fields(c)}
    values = {k: v for k, v in values.items() if k in own or k not in known}
    return from_hyperparameters(values, cls, what="setting")


def saved_settings(out: Path, cls: type) -> dict[str, Any] | None:
    """The settings of the run in `out` (its settings.json) as field values of `cls`,
    the directory settings left out; None when it has none."""
    path = out / SETTINGS_FILE
    if not path.is_file():
        return None
    values = config_values(str(path), cls)
    for name in _DIRECTORY_SETTINGS:
        values.pop(name, None)
    return values


def resume_settings(settings: Any, explicit: Collection[str]) -> tuple[Any, set[str], str]:
    """With --resume and a run in --out: the run's saved settings for every field not in
    `explicit` (what the user gave). Returns the settings, the fields that now count as
    given (a preset must not change a resumed run), and a line saying what changed ('' if
    nothing is resumed).

    Raises:
        ConfigError: the command changes what the run's network depends on.
    """
    if not getattr(settings, "resume", False) or not getattr(settings, "out", ""):
        return settings, set(explicit), ""
    out = Path(settings.out)
    saved = saved_settings(out, type(settings))
    if saved is None:
        return settings, set(explicit), ""
    resumed = dataclasses.replace(settings, **{k: v for k, v in saved.items()
                                               if k not in explicit})
    check_resume(saved, resumed, out, explicit)
    mine = {name: getattr(settings, name) for name in explicit if name in saved}
    changed = {name: (saved[name], value) for name, value in mine.items()
               if _comparable(saved[name]) != _comparable(value)}
    line = f"resuming {out} with its saved settings"
    if changed:
        line += "; changed: " + ", ".join(f"{k} {_show(a)} -> {_show(b)}"
                                          for k, (a, b) in sorted(changed.items()))
    return resumed, set(explicit) | set(saved), line


def check_resume(saved: dict[str, Any], settings: Any, out: Path,
                 explicit: Collection[str] | None = None) -> None:
    """Refuse a resume whose settings differ from the saved run in RESUME_FIXED.

    Raises:
        ConfigError: one line naming the setting, both values and what to do.
    """
    for name in RESUME_FIXED:
        if name not in saved or not hasattr(settings, name):
            continue
        mine = getattr(settings, name)
        if _comparable(saved[name]) != _comparable(mine):
            flag = f"--{name.replace('_', '-')}"
            how = (f"leave {flag} out to continue it as it was"
                   if explicit is None or name in explicit else f"give {flag} "
                   f"{_show(saved[name])} to continue it")
            raise ConfigError(
                f"--resume: the run in {out} was trained with {flag} {_show(saved[name])}, "
                f"this command has {_show(mine)}; {how}, or choose a new --out")


def write_settings(out: Path, settings: Any) -> None:
    """Write every setting of the command that starts a run to <out>/settings.json."""
    write_json(out / SETTINGS_FILE, dataclasses.asdict(settings))


def write_json(path: Path, value: Any) -> None:
    """Write `value` as JSON whole or not at all (a temporary file, then a rename).

    Raises:
        OutputError: it could not be written (a full disk); no temporary file is left.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(value, indent=2))
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _comparable(value: Any) -> Any:
    return list(value) if isinstance(value, (tuple, list)) else value


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return " ".join(str(v) for v in value) or "(none)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if value != "" else "''"
