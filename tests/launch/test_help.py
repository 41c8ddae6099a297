"""What `hetrl <command> --help` shows: the essentials first, every flag once, and the
presets that replace a default; and a bare list flag refused. Nothing here trains."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hetrl.launch.cli import COMMANDS, main
from hetrl.launch.presets import PRESETS


def _help(command: str, capsys, monkeypatch, *args: str) -> str:
    monkeypatch.setenv("COLUMNS", "100")  # one column of boxes, whatever the terminal
    with pytest.raises(SystemExit) as exit_info:
        main([command, *args, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _sections(output: str) -> dict[str, dict[str, str]]:
    """Section -> flag -> its help text (wrapped lines joined), in the order shown.

    Help into a pipe is plain text: a section is a heading ` NAME options`, a rule, its
    description, a rule and its flags (`  --flag TYPE  help`, wrapped lines indented)."""
    sections: dict[str, dict[str, str]] = {}
    flags: dict[str, str] | None = None
    flag = ""
    for line in output.splitlines():
        heading = re.fullmatch(r" ([a-z]+) options\s*", line)
        text = line.strip()
        if heading:
            flags, flag = sections.setdefault(heading.group(1), {}), ""
        elif flags is None or set(text) <= {"-"}:  # before the sections, a gap or a rule
            continue
        elif line.startswith("  --"):
            flag = text.split()[0].rstrip(",")
            flags[flag] = text
        elif flag:
            flags[flag] += " " + text
    return sections


ESSENTIAL_FLAGS = {
    "local": ["--env", "--total-steps", "--workers", "--envs-per-worker", "--seed",
              "--preset", "--out"],
    "emulate": ["--env", "--total-steps", "--env-hosts", "--workers-per-env-host",
                "--envs-per-worker", "--seed", "--preset", "--out"],
    "submit": ["--env", "--total-steps", "--env-count", "--workers-per-env-host",
               "--envs-per-worker", "--seed", "--preset", "--output"],
    "launch": ["--env", "--total-steps", "--workers-per-env-host", "--envs-per-worker",
               "--seed", "--preset"],  # a job writes into its model directory: no --out
}


@pytest.mark.parametrize("command", sorted(ESSENTIAL_FLAGS))
def test_essentials_come_first_and_every_flag_is_listed_once(command: str, capsys,
                                                             monkeypatch) -> None:
    sections = _sections(_help(command, capsys, monkeypatch))
    assert list(sections)[:2] == ["essentials", "env"]
    assert list(sections["essentials"]) == ESSENTIAL_FLAGS[command]
    listed = [flag for flags in sections.values() for flag in flags]
    cls = COMMANDS[command][0]
    hidden = set(getattr(cls, "hidden_flags", ()))
    fields = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in hidden]
    assert sorted(listed) == sorted(f"--{name.replace('_', '-')}" for name in fields)


def test_the_other_sections_keep_their_order(capsys, monkeypatch) -> None:
    sections = _sections(_help("local", capsys, monkeypatch))
    assert list(sections) == ["essentials", "env", "run", "algorithm", "policy", "rollout",
                              "evaluation", "checkpoints", "output", "reliability"]
    assert list(sections["env"]) == ["--env-import", "--drop-observations", "--atari",
                                     "--atari-noop-max", "--atari-frame-skip",
                                     "--atari-screen-size", "--atari-frame-stack",
                                     "--atari-sticky-actions"]
    assert "--startup-timeout" in sections["run"] and "--workers" not in sections["run"]
    assert "--learning-rate" in sections["algorithm"]
    essentials = sections["essentials"]
    assert "Gymnasium id" in essentials["--env"]  # the field's docstring, as in its home
    assert "(default: 300000)" in essentials["--total-steps"]


@pytest.mark.parametrize("command", ["local", "emulate", "submit", "launch"])
def test_a_default_a_preset_replaces_names_the_presets(command: str, capsys,
                                                       monkeypatch) -> None:
    flags = {flag: text for section in _sections(_help(command, capsys, monkeypatch)).values()
             for flag, text in section.items()}
    assert flags["--learning-rate"].endswith(
        "(default: 0.001; presets: continuous 0.0003, atari 0.00025)")
    assert flags["--fragment-length"].endswith("(default: 64; presets: atari 128)")
    assert flags["--normalize-rewards"].endswith("(default: True; presets: atari False)")
    assert flags["--atari"].endswith("(default: False; presets: atari True)")
    # continuous sets fragments_per_batch to its shipped default: nothing to say
    assert flags["--fragments-per-batch"].endswith("(default: auto)")
    set_by_a_preset = {f"--{name.replace('_', '-')}" for values in PRESETS.values()
                       for name in values} - {"--fragments-per-batch"}
    for flag, text in flags.items():
        assert ("presets:" in text) == (flag in set_by_a_preset), text


@pytest.mark.parametrize("command", ["learner", "worker", "plan"])
def test_commands_that_apply_no_preset_show_plain_defaults(command: str, capsys,
                                                           monkeypatch) -> None:
    output = _help(command, capsys, monkeypatch)
    assert "presets:" not in output


def test_a_config_value_wins_over_the_presets_so_they_are_not_shown(
        tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "c.yaml").write_text("learning-rate: 5.0e-4\n")
    flags = {flag: text for section in _sections(
        _help("local", capsys, monkeypatch, "--config", str(tmp_path / "c.yaml"))).values()
        for flag, text in section.items()}
    assert flags["--learning-rate"].endswith("(default: 0.0005)")
    assert flags["--epochs"].endswith("(default: 4; presets: continuous 10)")


def test_a_bare_hidden_sizes_is_refused(capsys) -> None:
    assert main(["local", "--hidden-sizes"]) == 2  # refused before anything starts
    err = capsys.readouterr().err
    assert "--hidden-sizes needs at least one width, e.g. --hidden-sizes 64 64" in err
    assert "Traceback" not in err
