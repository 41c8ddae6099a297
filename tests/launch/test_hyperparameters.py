"""Settings to job hyperparameters and back (launch/hyperparameters.py), for every field."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Literal

import pytest

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
        for given in ({k: json.loads(v) for k, v in stored.items()}, stored):
            assert ClusterSettings(**from_hyperparameters(given, ClusterSettings)) == settings
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
