"""Settings to SageMaker hyperparameters and back: the one pair of conversions.

`to_hyperparameters` writes each ClusterSettings field that differs from its default as
SageMaker stores it (a JSON value as a string); `from_hyperparameters` reads them back,
typed by the settings class, and also serves every other place that turns names and
loosely typed values into settings (`--config` files, `run_local` keywords): unknown
names get the nearest known ones, malformed values say what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal

from hetrl.launch.settings import ClusterSettings
from hetrl.rollout.errors import ConfigError
from hetrl.rollout.settings import require

MAX_HYPERPARAMETERS = 100
"""CreateTrainingJob takes at most this many hyperparameters..."""
MAX_VALUE_LENGTH = 2500
"""...each at most this many characters long."""


def to_hyperparameters(settings: ClusterSettings,
                       leave_out: Iterable[str] = ()) -> dict[str, str]:
    """Each ClusterSettings field of `settings` that differs from its default (but those
    in `leave_out`), as name -> JSON value (tuples as lists).

    Raises:
        ConfigError: more values than a job takes, one too long, or one that SageMaker's
            sm_train.sh cannot pass on.
    """
    skipped = set(leave_out)
    values = {}
    for field in dataclasses.fields(ClusterSettings):
        default = (field.default if field.default is not dataclasses.MISSING
                   else field.default_factory())  # type: ignore[misc,operator]
        value = getattr(settings, field.name)
        if field.name not in skipped and value != default:
            values[field.name] = json.dumps(list(value) if isinstance(value, tuple) else value)
    require(len(values) <= MAX_HYPERPARAMETERS, f"{len(values)} settings differ from their "
            f"defaults; a job takes at most {MAX_HYPERPARAMETERS} hyperparameters")
    for key, value in values.items():
        flag = f"--{key.replace('_', '-')}"
        require(len(value) <= MAX_VALUE_LENGTH,
                f"{flag} is too long for a hyperparameter ({MAX_VALUE_LENGTH} characters)")
        # sm_train.sh sources `export SM_HP_KEY='value'` under `set -e`: a quote ends the
        # string there and every host would fail before hetrl starts.
        require("'" not in value, f"{flag} {value} contains a ' (single quote), which "
                "SageMaker's sm_train.sh cannot pass on: remove it")
    return values


def from_hyperparameters(values: dict[str, Any], cls: type,
                         what: str = "hyperparameter") -> dict[str, Any]:
    """Map hyperparameters (or any name -> value mapping) onto field values of `cls`.

    Keys may use underscores or dashes (`total_steps`, `total-steps`); SageMaker's own
    `sagemaker_*` keys are ignored. Values may be typed already or strings (JSON where
    SageMaker encoded them, plain text where a user typed them).

    Raises:
        ConfigError: an unknown key (with the nearest known names) or a malformed value;
            `what` names the kind of value in the message.
    """
    values = {key: raw for key, raw in values.items() if not key.startswith("sagemaker_")}
    check_names(values, cls, what)
    hints = typing.get_type_hints(cls)
    return {key.replace("-", "_"): _convert(key, _decoded(raw), hints[key.replace("-", "_")],
                                            what)
            for key, raw in values.items()}


def _decoded(raw: Any) -> Any:
    """A string holding JSON (as to_hyperparameters writes) as its value; else as given."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            pass
    return raw


def check_names(names: Iterable[str], cls: type, what: str) -> None:
    """Refuse names (dashes allowed) that are not fields of `cls`, naming the nearest.

    Raises:
        ConfigError: `what` names the kind of name in the message ("hyperparameter").
    """
    known = sorted(f.name for f in dataclasses.fields(cls))
    for key in names:
        name = key.replace("-", "_")
        if name not in known:
            near = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ConfigError(f"unknown {what} {key!r}{hint} ({cls.__name__} lists them all)")


def _convert(key: str, raw: Any, kind: Any, what: str) -> Any:
    """Convert one value (already JSON-decoded where it could be) to `kind`."""
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
                    return _convert(key, raw, option, what)
                except ConfigError as exc:
                    errors.append(str(exc).split(" is malformed: ", 1)[-1])
            raise ValueError("; ".join(errors))
        if origin is tuple:
            item_kind = typing.get_args(kind)[0]
            if isinstance(raw, str):
                raw = json.loads(raw) if raw.strip().startswith("[") else raw.split(",")
            if not isinstance(raw, list | tuple):
                raw = [raw]
            return tuple(_convert(key, item, item_kind, what) for item in raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what} {key}={raw!r} is malformed: {exc}") from exc
    raise ConfigError(f"{what} {key}: unsupported type {kind}")
