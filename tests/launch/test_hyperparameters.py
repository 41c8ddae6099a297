"""Settings to job hyperparameters and back (launch/hyperparameters.py), for every field."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrl.launch.hyperparameters import check_names, from_hyperparameters, to_hyperparameters
from hetrl.launch.settings import ClusterSettings
from hetrl.rollout.errors import ConfigError


def _changed_values(field: dataclasses.Field, kind: Any) -> list[Any]:
    default = (field.default if field.default is not dataclasses.MISSING
               else field.default_factory())  # type: ignore[misc]
    origin = typing.get_origin(kind)
    if kind is bool:
        return [not default]
    if kind is int:
        return [default + 1, default + 2]
    if kind is float:
        return [v for v in (default / 2, 0.5, default + 1) if v != default]
    if kind is str:
        return [v for v in ("cpu", "my_pkg.nets:Net", "a, b [c]") if v != default]
    if origin is Literal:
        return [v for v in typing.get_args(kind) if v != default]
    if origin is tuple:
        return [("32", "16") if typing.get_args(kind)[0] is str else (32, 16)]
    return [8]  # int | Literal["auto"]


@pytest.mark.parametrize("field", dataclasses.fields(ClusterSettings), ids=lambda f: f.name)
def test_every_setting_survives_the_round_trip_through_hyperparameters(field) -> None:
    kind = typing.get_type_hints(ClusterSettings)[field.name]
    for value in _changed_values(field, kind):
        try:
            settings = ClusterSettings(**{field.name: value})
        except ConfigError:
            continue  # a value this field's checks refuse; try the next
        stored = to_hyperparameters(settings)
        assert list(stored) == [field.name], stored
        # As the toolkit hands them over (JSON-decoded), and as strings (where not).
        for handed in ({k: json.loads(v) for k, v in stored.items()}, stored):
            assert ClusterSettings(**from_hyperparameters(handed, ClusterSettings)) == settings
        return
    pytest.fail(f"no candidate value for {field.name} passes its checks")


def test_left_out_settings_are_not_hyperparameters() -> None:
    settings = ClusterSettings(total_steps=5, out="/tmp/x")
    assert to_hyperparameters(settings, leave_out={"out"}) == {"total_steps": "5"}


def test_unknown_names_get_the_nearest_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'learner_grup'; did you mean "
                                          "learner_group"):
        check_names(["learner_grup"], ClusterSettings, "setting")


def test_a_quote_or_an_overlong_value_is_refused_before_the_job_exists() -> None:
    with pytest.raises(ConfigError, match="single quote"):
        to_hyperparameters(ClusterSettings(env="it's"))
    with pytest.raises(ConfigError, match="too long"):
        to_hyperparameters(ClusterSettings(env_import=("m" * 3000,)))


def test_hyperparameters_map_onto_settings() -> None:
    values = from_hyperparameters({
        "total_steps": 5000, "learning-rate": "0.0003", "anneal_lr": "false",
        "hidden_sizes": "[32, 32]", "env_groups": "cpu_a,cpu_b", "vector_mode": "sync",
        "env": "CartPole-v1", "sagemaker_program": "launcher.py",
    }, ClusterSettings)
    settings = ClusterSettings(**values)
    assert settings.total_steps == 5000 and settings.learning_rate == pytest.approx(3e-4)
    assert settings.anneal_lr is False and settings.hidden_sizes == (32, 32)
    assert settings.env_groups == ("cpu_a", "cpu_b") and settings.vector_mode == "sync"


@pytest.mark.parametrize(
    "hyperparameters, match",
    [
        ({"total_step": 5}, "unknown hyperparameter 'total_step'; did you mean total_steps"),
        ({"total_steps": "many"}, "total_steps='many' is malformed"),
        ({"total_steps": 1.5}, "expected an integer"),
        ({"anneal_lr": "maybe"}, "expected true or false"),
        ({"vector_mode": "turbo"}, "expected one of"),
    ],
)
def test_bad_hyperparameters_are_clear_errors(hyperparameters: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        from_hyperparameters(hyperparameters, ClusterSettings)


def _values_of(kind: Any) -> st.SearchStrategy:
    """Any value of a settings field's type, as a user or a job could hand it over."""
    origin = typing.get_origin(kind)
    if origin is Literal:
        return st.sampled_from(typing.get_args(kind))
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_values_of(option) for option in typing.get_args(kind)))
    if origin is tuple:
        return st.lists(_values_of(typing.get_args(kind)[0]), max_size=4).map(tuple)
    return {bool: st.booleans(), int: st.integers(-2**53, 2**53),
            float: st.floats(allow_nan=False, allow_infinity=False),
            str: st.text(max_size=20)}[kind]


_KINDS = {name: kind for name, kind in typing.get_type_hints(ClusterSettings).items()
          if name in {f.name for f in dataclasses.fields(ClusterSettings)}}
_BY_KIND = {str(kind): name for name, kind in _KINDS.items()}  # one field per type


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(_BY_KIND.values())).flatmap(
    lambda name: st.tuples(st.just(name), _values_of(_KINDS[name]))))
def test_any_value_of_any_setting_type_survives_the_round_trip(name_value) -> None:
    """Every type a setting has, any value of it: written as a job's hyperparameter (JSON
    text), handed over JSON-decoded (as the toolkit does), and read back, it is the same
    value; tyro, the CLI's parser, does the reading, so a flag means the same."""
    name, value = name_value
    text = json.dumps(list(value) if isinstance(value, tuple) else value)
    for given_value in (text, json.loads(text)):
        read = from_hyperparameters({name: given_value}, ClusterSettings)[name]
        assert read == value and type(read) is type(value), (given_value, read)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(_BY_KIND.values())).flatmap(
    lambda name: st.tuples(st.just(name), _values_of(_KINDS[name]).filter(
        lambda v: not isinstance(v, tuple | str) or "," not in str(v)))))
def test_a_value_typed_as_text_reads_as_the_cli_reads_it(name_value) -> None:
    """The same value typed as plain text (a config file's string, a SageMaker console
    entry) reads exactly as the same word given to the command line's flag."""
    import tyro

    name, value = name_value
    kind = _KINDS[name]
    words = [str(item) for item in value] if isinstance(value, tuple) else [str(value)]
    text = ",".join(words) if isinstance(value, tuple) else str(value)
    if isinstance(value, str) and value != value.strip() or isinstance(value, tuple) and any(
            w != w.strip() for w in words):
        return  # comma-separated text is trimmed, as a user would expect
    read = from_hyperparameters({name: text}, ClusterSettings)[name]
    assert read == tyro.cli(kind, args=["--", *words], console_outputs=False), (text, read)
