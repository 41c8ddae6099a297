"""A run's settings.json reruns it (--config) and continues it (--resume): every setting of
the command is in it, and a resume that would change the network is refused up front."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hetrl.launch.config import config_values, resume_settings, saved_settings, write_settings
from hetrl.launch.local import prepare_out_dir
from hetrl.launch.settings import LocalSettings
from hetrl.rollout.errors import ConfigError
from tests.helpers import hetrl

# Settings that differ from every shipped default, so that a lost one shows.
UNUSUAL = dict(env="Acrobot-v1", workers=1, envs_per_worker=3, fragment_length=16,
               vector_mode="sync", normalize_rewards=False, advantages="vtrace",
               hidden_sizes=(32,), learning_rate=7e-4, total_steps=4096, seed=5,
               credits_per_worker=1, report=False, progress=False)


def test_settings_json_holds_every_setting_and_config_gives_them_back(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    settings = LocalSettings(**UNUSUAL, out=str(out), resume=True)
    write_settings(out, settings)
    values = config_values(str(out / "settings.json"), LocalSettings)
    # The run's own folder, and what to do with it, are not part of a rerun.
    assert {"out", "resume", "overwrite"}.isdisjoint(values)
    assert LocalSettings(**values) == dataclasses.replace(settings, out="", resume=False)


@pytest.mark.slow
def test_a_rerun_from_settings_json_is_the_same_run(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    args = [f"--{k.replace('_', '-')}" if v is True else
            f"--no-{k.replace('_', '-')}" if v is False else None for k, v in UNUSUAL.items()]
    flags: list[str] = []
    for (name, value), flag in zip(UNUSUAL.items(), args, strict=True):
        if flag is not None:
            flags.append(flag)
        elif isinstance(value, tuple):
            flags += [f"--{name.replace('_', '-')}", *map(str, value)]
        else:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    proc = hetrl("local", *flags, "--out", str(first))
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    proc = hetrl("local", "--config", str(first / "settings.json"), "--out", str(second))
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    a, b = (json.loads((d / "settings.json").read_text()) for d in (first, second))
    assert a.pop("out") == str(first) and b.pop("out") == str(second)
    assert a == b
    # The workers ran as the first run's did: 1 worker of 3 envs, synchronous.
    worker = json.loads((second / "launch" / "worker-0.json").read_text())
    assert (worker["envs_per_worker"], worker["vector_mode"]) == (3, "sync")
    assert not (second / "launch" / "worker-1.json").exists()


def _saved_run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    out.mkdir()
    write_settings(out, LocalSettings(**UNUSUAL, out=str(out)))
    return out


def test_resume_continues_with_the_saved_settings_and_says_what_changed(tmp_path: Path) -> None:
    out = _saved_run(tmp_path)
    given = LocalSettings(out=str(out), resume=True, total_steps=8192)
    resumed, explicit, line = resume_settings(given, {"out", "resume", "total_steps"})
    assert resumed.total_steps == 8192  # given wins
    assert (resumed.env, resumed.workers, resumed.envs_per_worker) == ("Acrobot-v1", 1, 3)
    assert resumed.hidden_sizes == (32,) and not resumed.normalize_rewards
    assert {"env", "learning_rate"} <= explicit  # a preset changes nothing of a resumed run
    assert "total_steps 4096 -> 8192" in line


@pytest.mark.parametrize(("given", "flag"), [({"env": "CartPole-v1"}, "--env"),
                                              ({"env": "Acrobot-v1", "hidden_sizes": (64, 64)},
                                               "--hidden-sizes")])
def test_a_resume_that_changes_the_network_is_refused(tmp_path: Path, given, flag) -> None:
    out = _saved_run(tmp_path)
    settings = LocalSettings(out=str(out), resume=True, **given)
    with pytest.raises(ConfigError, match=f"trained with {flag} .*leave {flag} out"):
        resume_settings(settings, {"out", "resume", *given})
    # A settings object handed to run_local as it is meets the same check.
    with pytest.raises(ConfigError, match=f"trained with {flag}"):
        prepare_out_dir(settings)


def test_resume_through_the_cli_is_refused_before_anything_starts(tmp_path: Path) -> None:
    out = _saved_run(tmp_path)
    proc = hetrl("local", "--out", str(out), "--resume", "--env", "Pendulum-v1")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, output
    assert "--resume: the run in" in output and "trained with --env Acrobot-v1" in output
    assert "Traceback" not in output
    assert not (out / "launch").exists()  # nothing was spawned


def test_a_run_without_settings_json_resumes_as_given(tmp_path: Path) -> None:
    assert saved_settings(tmp_path, LocalSettings) is None
    given = LocalSettings(out=str(tmp_path), resume=True)
    assert resume_settings(given, {"out", "resume"})[0] == given
