"""The hetrl command's behaviour at its edges: output directories, bad paths, pipes, hints.
Nothing here trains; every refusal happens before a process is spawned."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hetrl.launch.local import prepare_out_dir
from hetrl.launch.settings import LocalSettings
from hetrl.rollout.errors import ConfigError
from tests.helpers import ROOT, hetrl


def _finished_run(out: Path) -> None:
    out.mkdir(parents=True)
    (out / "settings.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"global_step": 30720}\n')


def test_default_out_is_new_for_every_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = prepare_out_dir(LocalSettings(env="my_pkg.envs:Corridor", seed=3))
    assert re.fullmatch(r"runs/my_pkg\.envs-Corridor__seed3__\d{8}-\d{6}", str(out)), out
    assert out.is_dir()


def test_a_used_out_is_refused_unless_resumed_or_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _finished_run(out)
    with pytest.raises(ConfigError, match="already holds a previous run: pass --resume"):
        prepare_out_dir(LocalSettings(out=str(out)))
    assert prepare_out_dir(LocalSettings(out=str(out), resume=True)) == out
    assert (out / "metrics.jsonl").exists()  # resuming keeps the run
    with pytest.raises(ConfigError, match="give one of them"):
        prepare_out_dir(LocalSettings(out=str(out), resume=True, overwrite=True))
    assert prepare_out_dir(LocalSettings(out=str(out), overwrite=True)) == out
    assert list(out.iterdir()) == []  # the previous run's outputs are gone


def test_overwrite_never_deletes_what_hetrl_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("years of work")
    with pytest.raises(ConfigError, match="no hetrl run wrote"):
        prepare_out_dir(LocalSettings(out=str(tmp_path), overwrite=True))
    assert (tmp_path / "thesis.tex").exists()


@pytest.mark.parametrize("out", ["/dev/null/x", "/proc/forbidden"])
def test_unusable_out_is_a_clear_error_naming_the_flag(out: str) -> None:
    proc = hetrl("local", "--out", out, "--total-steps", "2048")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, output
    assert f"--out {out}: cannot create or write" in output
    assert "Traceback" not in output and "hetrl local --help" in output


def test_used_out_through_the_cli(tmp_path: Path) -> None:
    _finished_run(tmp_path / "run")
    proc = hetrl("local", "--out", str(tmp_path / "run"), "--total-steps", "2048")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "--resume" in output and "--overwrite" in output, output
    assert not (tmp_path / "run" / "launch").exists()  # nothing was spawned


def test_help_into_a_closed_pipe_prints_no_traceback() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "hetrl.launch", "local", "--help"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # like `| head` that has already exited
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()


def test_hints_name_the_commands_own_help() -> None:
    proc = hetrl("local", "--no-such-flag")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "hetrl local --help" in output, output


def test_config_file_sets_defaults_and_flags_override(tmp_path: Path) -> None:
    from hetrl.launch.config import config_values

    run = tmp_path / "run"
    run.mkdir()
    (run / "settings.json").write_text(json.dumps({  # as a learner writes it
        "env": "Pendulum-v1", "hidden_sizes": [32, 32], "gamma": 0.9, "out": str(run),
        "worker_addresses": ["127.0.0.1:1"], "finishing_file": "x"}))
    values = config_values(str(run / "settings.json"), LocalSettings)
    assert values == {"env": "Pendulum-v1", "hidden_sizes": (32, 32), "gamma": 0.9}
    (tmp_path / "c.yaml").write_text("env: Acrobot-v1\nlearning-rate: 3.0e-4\nanneal_lr: false\n")
    assert config_values(str(tmp_path / "c.yaml"), LocalSettings) == {
        "env": "Acrobot-v1", "learning_rate": 3e-4, "anneal_lr": False}
    (tmp_path / "bad.yaml").write_text("learning_rat: 0.1\n")
    with pytest.raises(ConfigError, match="did you mean learning_rate"):
        config_values(str(tmp_path / "bad.yaml"), LocalSettings)

    # Through the CLI: the file's values become the defaults, a flag overrides one.
    proc = hetrl("local", "--config", str(tmp_path / "c.yaml"), "--env", "CartPole-v1",
                 "--help")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert "0.0003" in output and "--config FILE" in output
    proc = hetrl("local", "--config", str(tmp_path / "bad.yaml"))
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "did you mean learning_rate" in output, output


def test_track_without_wandb_says_how_to_get_it(tmp_path: Path) -> None:
    # As if wandb were not installed: None in sys.modules makes its import fail.
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.modules['wandb'] = None; "
         "from hetrl.launch.cli import main; sys.exit(main())",
         "local", "--track", "--out", str(tmp_path / "run"), "--total-steps", "2048"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "pip install 'hetrl[track]'" in output, output
    assert not (tmp_path / "run" / "launch").exists()


@pytest.mark.slow
def test_track_logs_settings_and_charts_to_weights_and_biases(tmp_path: Path) -> None:
    """A real wandb run in offline mode (it writes its records locally, sends nothing)."""
    pytest.importorskip("wandb", reason="hetrl[track] is not installed")
    out = tmp_path / "tracked-run"
    wandb_env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                 **{name: str(tmp_path / "wandb-home") for name in
                    ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR")}}
    proc = hetrl("local", "--track", "--wandb-project", "hetrl-test", "--out", str(out),
                 "--total-steps", "4096", "--workers", "1", "--envs-per-worker", "4",
                 "--fragment-length", "32", "--no-progress", env=wandb_env)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    records = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(records) == 1, list((out / "wandb").rglob("*"))
    data = records[0].read_bytes()
    for expected in (b"hetrl-test", b"tracked-run", b"CartPole-v1", b"learning_rate",
                     b"charts/mean_return_100"):
        assert expected in data, expected


def _sections_in_help(output: str) -> list[str]:
    return re.findall(r"─ ([a-z]+) options ─", output)


def _flags_in_section(output: str, section: str) -> list[str]:
    box = output.split(f"─ {section} options ─", 1)[1].split("╰", 1)[0]
    return re.findall(r"^│ (--[a-z0-9-]+)", box, flags=re.MULTILINE)


def test_help_lists_the_essentials_first_then_the_rest_by_topic() -> None:
    proc = hetrl("local", "--help")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert _sections_in_help(output) == [
        "essentials", "env", "run", "algorithm", "policy", "rollout", "evaluation",
        "checkpoints", "output", "reliability"]
    assert _flags_in_section(output, "essentials")[:3] == ["--env", "--total-steps",
                                                            "--workers"]
    assert "--startup-timeout" in _flags_in_section(output, "run")
    assert "--learning-rate" in _flags_in_section(output, "algorithm")
    assert "--keepalive-time" in _flags_in_section(output, "reliability")


def test_submit_help_puts_the_aws_flags_after_the_env_and_hides_what_a_job_ignores() -> None:
    proc = hetrl("submit", "--help")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert _sections_in_help(output)[:3] == ["essentials", "env", "submit"]
    assert {"--role", "--region"} <= set(_flags_in_section(output, "submit"))
    assert "--output" in _flags_in_section(output, "essentials")  # submit's --out
    assert "--out " not in output  # a job writes into its model directory, whatever --out says
    assert "--control-port" in _flags_in_section(output, "cluster")


# emulate and launch start the heaviest imports (9 to 10 s beside a busy machine): slow.
@pytest.mark.parametrize("command", ["local", pytest.param("emulate", marks=pytest.mark.slow),
                                     pytest.param("launch", marks=pytest.mark.slow), "worker"])
def test_every_setting_is_still_a_flag_of_the_same_name(command: str) -> None:
    """Sections change the help only: each field parses from its own flag, as before."""
    import dataclasses

    from hetrl.launch import flags
    from hetrl.launch.cli import COMMANDS

    cls = COMMANDS[command][0]
    default = cls()
    hidden = set(getattr(cls, "hidden_flags", ()))
    for field in dataclasses.fields(cls):
        if field.name in hidden:
            continue
        value = getattr(default, field.name)
        if isinstance(value, bool):
            args, changed = [f"--{'no-' if value else ''}{field.name.replace('_', '-')}"], not value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            changed = value + 1
            args = [f"--{field.name.replace('_', '-')}", str(changed)]
        else:
            continue
        try:
            parsed = flags.parse(cls, args, prog="t", description="")
        except ConfigError:
            continue  # the changed value breaks a check (e.g. a port range): fine here
        assert getattr(parsed, field.name) == changed, field.name
        assert dataclasses.replace(parsed, **{field.name: value}) == default, field.name


def test_every_deferred_command_names_a_function_that_exists() -> None:
    from hetrl.launch.cli import COMMANDS, Deferred

    deferred = [run for _, run in COMMANDS.values() if isinstance(run, Deferred)]
    assert len(deferred) >= 3  # submit, fetch, learner (worker picks its module itself)
    for run in deferred:
        assert callable(run.resolve()), run.target
