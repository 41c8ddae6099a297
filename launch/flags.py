"""Flags of a settings class, grouped under headings in the order users reach for them.

The settings classes stay flat (`settings.workers`, one field per flag, documented where
it is defined); only the command line sees sections. `parse` builds, per command, one
small dataclass per section from the class's own fields (their defaults as the command
defines them, their docstrings as help), lets tyro parse those with the section
prefixes omitted, so every flag keeps its name, and builds the flat settings from them,
which validates them once. The first section, essentials, holds the flags a new user
reaches for, taken out of their home sections; in the commands that apply a preset, a
default that a preset replaces says so. This module only parses; it runs nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import shlex
import textwrap
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import tyro

from hetrl.launch.presets import PRESETS
from hetrl.launch.settings import ClusterSettings, LocalRunSettings, LocalSettings
from hetrl.learner.settings import CheckpointSettings, EvalSettings, OutputSettings, TrainSettings
from hetrl.rollout.settings import EnvSettings, PolicySettings, ReliabilitySettings, RolloutSettings

T = TypeVar("T")

# (section name, the settings class whose fields it lists), after the essentials. The
# fields a command defines itself (e.g. submit's AWS flags) come right after the env.
SECTIONS: tuple[tuple[str, type], ...] = (
    ("env", EnvSettings),
    ("run", LocalRunSettings),
    ("algorithm", TrainSettings),
    ("policy", PolicySettings),
    ("rollout", RolloutSettings),
    ("cluster", ClusterSettings),
    ("evaluation", EvalSettings),
    ("checkpoints", CheckpointSettings),
    ("output", OutputSettings),
    ("reliability", ReliabilitySettings),
)

# The flags a new user reaches for, in this order, listed first where the command has
# them: the env, how long, how many workers (local) or hosts and workers per host (the
# cluster commands), the seed, the preset and where the results go (submit: --output).
ESSENTIALS: tuple[str, ...] = (
    "env", "total_steps", "workers", "env_hosts", "env_count", "workers_per_env_host",
    "envs_per_worker", "seed", "preset", "out", "output",
)
ESSENTIALS_DOC = "The flags most runs set; the sections below hold the rest."

# The commands that apply a preset to the settings the user does not give (hetrl local
# and the cluster hosts, which emulate and submit start); the learner and the workers
# get settings with the preset already applied.
PRESET_COMMANDS = (LocalSettings, ClusterSettings)


def parse(cls: type[T], args: list[str], prog: str, description: str,
          default: T | None = None) -> T:
    """Parse `args` into `cls`, with its help grouped by SECTIONS after the ESSENTIALS.

    A class that derives from no section, or has positional fields, is parsed flat.
    Fields named in `cls.hidden_flags` are not flags (they keep `default`'s value).
    `default` (a --config file's values) replaces the defaults shown and parsed.

    Raises:
        ConfigError: the values fail the settings' own checks.
    """
    sections = _sections(cls)
    if len(sections) < 2:
        return tyro.cli(cls, args=args, prog=prog, description=description,
                        default=default)  # type: ignore[return-value]
    settings_class: Any = cls  # a dataclass, which type[T] cannot say
    holder = _holder(settings_class,
                     tuple((name, tuple(fields)) for name, fields in sections.items()),
                     _preset_notes(settings_class, default))
    holder_default = None
    if default is not None:
        holder_default = holder(**{
            name: section(**{f.name: getattr(default, f.name)
                             for f in dataclasses.fields(section)})
            for name, section in _section_types(holder).items()})
    parsed = tyro.cli(holder, args=args, prog=prog, description=description,
                      default=holder_default)
    values = {f.name: getattr(default, f.name) for f in dataclasses.fields(settings_class)
              if default is not None and f.init}
    for name in _section_types(holder):
        values.update(dataclasses.asdict(getattr(parsed, name)))
    return cls(**values)


def _sections(cls: type) -> dict[str, list[dataclasses.Field]]:
    """Section name -> the fields of `cls` listed under it: the essentials, then SECTIONS
    order; {} for a class parsed flat (positional fields)."""
    hidden = set(getattr(cls, "hidden_flags", ()))
    fields = [f for f in dataclasses.fields(cls) if f.init and f.name not in hidden]
    if any(_is_positional(cls, f.name) for f in fields):
        return {}
    home: dict[str, str] = {}
    for name, section in SECTIONS:
        if issubclass(cls, section):
            for field_name in vars(section).get("__annotations__", {}):  # its own fields
                home.setdefault(field_name, name)
    own = _own_section_name(cls)
    order = [name for name, _ in SECTIONS[:1]] + [own] + [name for name, _ in SECTIONS[1:]]
    grouped: dict[str, list[dataclasses.Field]] = {name: [] for name in order}
    for f in fields:
        grouped[home.get(f.name, own)].append(f)
    sections = {name: group for name, group in grouped.items() if group}
    essentials = sorted((f for f in fields if f.name in ESSENTIALS),
                        key=lambda f: ESSENTIALS.index(f.name))
    if len(sections) < 2 or not essentials:  # one section: no headings at all
        return sections
    rest = {name: [f for f in group if f.name not in ESSENTIALS]
            for name, group in sections.items()}
    return {"essentials": essentials, **{name: group for name, group in rest.items() if group}}


def _own_section_name(cls: type) -> str:
    """`SubmitSettings` -> "submit": the heading of the fields a command adds."""
    return cls.__name__.removesuffix("Settings").lower() or "command"


def _is_positional(cls: type, name: str) -> bool:
    hint = typing.get_type_hints(cls, include_extras=True)[name]
    return tyro.conf.Positional in getattr(hint, "__metadata__", ())


@functools.cache
def _holder(cls: type, sections: tuple[tuple[str, tuple[dataclasses.Field, ...]], ...],
            preset_notes: tuple[tuple[str, str], ...] = ()) -> type:
    """A dataclass with one field per section, each a dataclass of that section's flags;
    a flag named in `preset_notes` shows its note after its default."""
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = field_docs(cls)
    notes = dict(preset_notes)
    section_docs = {name: section.__doc__ for name, section in SECTIONS}
    section_docs["essentials"] = ESSENTIALS_DOC
    holder_fields = []
    for name, fields in sections:
        section = dataclasses.make_dataclass(
            f"{cls.__name__}_{name}",
            [(f.name, Annotated[hints[f.name], tyro.conf.arg(
                help=docs.get(f.name, ""), help_behavior_hint=_default_hint(notes.get(f.name)))],
              _copy_default(f)) for f in fields])
        section.__doc__ = section_docs.get(name, "")
        holder_fields.append((name, tyro.conf.OmitArgPrefixes[section],  # type: ignore[valid-type,misc]
                              dataclasses.field(default_factory=section)))
    return dataclasses.make_dataclass(f"{cls.__name__}Flags", holder_fields)


def _section_types(holder: type) -> dict[str, type]:
    return {f.name: typing.get_args(f.type)[0] for f in dataclasses.fields(holder)}


def _copy_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=f.default_factory)
    return dataclasses.field(default=f.default)


def _shipped_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _preset_notes(cls: type, default: object | None) -> tuple[tuple[str, str], ...]:
    """(field name, "continuous 0.0003, atari 0.00025"): for a command that applies a
    preset, each field whose shipped default some preset replaces, with the presets'
    values. A field the --config file (`default`) changed has none: its value wins."""
    if not issubclass(cls, PRESET_COMMANDS):
        return ()
    notes = []
    for f in dataclasses.fields(cls):
        shipped = _shipped_default(f)
        if default is not None and getattr(default, f.name) != shipped:
            continue
        replaced = [f"{preset} {_label(values[f.name])}" for preset, values in PRESETS.items()
                    if f.name in values and values[f.name] != shipped]
        if replaced:
            notes.append((f.name, ", ".join(replaced)))
    return tuple(notes)


def _label(value: Any) -> str:
    """A value as tyro writes a default: sequences as their items, space separated."""
    if isinstance(value, (tuple, list, set)):
        return " ".join(shlex.quote(str(item)) for item in value)
    return str(value)


def _default_hint(note: str | None) -> Callable[[str], str] | None:
    """tyro's "(default: X)", with the presets that replace X when some do."""
    if note is None:
        return None  # tyro's own hint
    return lambda label: f"(default: {label}; presets: {note})"


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under its definition, the most derived one winning."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_class_field_docs(klass))
    return docs


@functools.cache
def _class_field_docs(klass: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError):  # defined where no source is (a REPL): no help text
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for statement, after in zip(body, body[1:], strict=False):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[statement.target.id] = " ".join(after.value.value.split())
    return docs
