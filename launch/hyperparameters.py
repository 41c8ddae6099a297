"""Settings to SageMaker hyperparameters and back: the one pair of conversions.

`to_hyperparameters` writes each ClusterSettings field that differs from its default as
SageMaker stores it (a JSON value as a string); `from_hyperparameters` reads them back,
typed by the settings class, and also serves every other place that turns names and
loosely typed values into settings (`--config` files, settings.json): unknown names get
the nearest known ones, malformed values say what was expected. Values are read by tyro,
the CLI's own parser, so a flag, a config file and a hyperparameter holding the same text
mean the same value (tests/launch/test_hyperparameters.py checks it for every type).
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
    return {name: _convert(key, _decoded(raw, hints[name]), hints[name], what)
            for key, raw in values.items() for name in [key.replace("-", "_")]}


def _decoded(raw: Any, kind: Any) -> Any:
    """A string holding JSON (as to_hyperparameters writes) as its value; else as given.
    Text meant as text stays as typed: a str setting decodes only a quoted JSON string."""
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return raw
        return raw if kind is str and not isinstance(value, str) else value
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
    """Convert one value (already JSON-decoded where it could be) to `kind` with the CLI's
    own parser (tyro), so that a config file, a hyperparameter and a flag given the same
    text always mean the same value."""
    import tyro  # the CLI's parser; imported here to keep `import hetrl.launch` light

    try:
        # "--" first: a value that starts with "-" is a value here, never a flag.
        return tyro.cli(kind, args=["--", *_tokens(raw, kind)], console_outputs=False,
                        add_help=False)
    except SystemExit:
        raise ConfigError(f"{what} {key}={raw!r} is malformed: expected {_expected(kind)}"
                          ) from None


def _tokens(raw: Any, kind: Any) -> list[str]:
    """The command-line words of one value: a list (JSON, or comma-separated text) for a
    tuple setting, one word otherwise, each written as the CLI reads it."""
    if typing.get_origin(kind) is tuple:
        item_kind = typing.get_args(kind)[0]
        if isinstance(raw, str):
            raw = [item.strip() for item in raw.split(",")] if raw.strip() else []
        items = list(raw) if isinstance(raw, list | tuple) else [raw]
        return [_word(item, item_kind) for item in items]
    return [_word(raw, kind)]


_BOOL_WORDS = {"true": "True", "yes": "True", "1": "True",
               "false": "False", "no": "False", "0": "False"}


def _word(value: Any, kind: Any) -> str:
    """One value as a command-line word: booleans (also true/yes/1 as text for a bool
    setting) and integral floats (YAML's 1e6, JSON's 5.0) as the CLI spells them, lists
    and mappings as JSON."""
    if kind is bool and isinstance(value, str | int) and str(value).strip().lower() in (
            _BOOL_WORDS):
        return _BOOL_WORDS[str(value).strip().lower()]
    if kind is str and not isinstance(value, str):  # a YAML number or list for a text setting
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def _expected(kind: Any) -> str:
    """What a value of `kind` looks like, for an error message."""
    origin = typing.get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(kind))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(option) for option in typing.get_args(kind))
    if origin is tuple:
        return f"a list (JSON or comma-separated) of {_expected(typing.get_args(kind)[0])}"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "text"}.get(kind, str(kind))
