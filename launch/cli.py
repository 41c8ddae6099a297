"""The `hetrl` command. Subcommands and flags are generated from the settings dataclasses
(one per role), so each flag is documented once, where its field is defined."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tyro

from hetrl.launch import flags
from hetrl.launch.config import config_values, resume_settings
from hetrl.launch.emulate import EmulateSettings
from hetrl.launch.jobs import FetchSettings
from hetrl.launch.plan import PlanSettings
from hetrl.launch.settings import (
    ClusterSettings,
    EnjoySettings,
    LocalSettings,
    ReportSettings,
    flags_given,
)
from hetrl.launch.submit import SubmitSettings  # imports no SDK; it loads only when used
from hetrl.learner.settings import LearnerSettings
from hetrl.rollout.errors import ConfigError, HetrlError
from hetrl.rollout.lifetime import LOG_FORMAT
from hetrl.rollout.settings import WorkerSettings
from hetrl.rollout.userpath import user_modules_importable

# Each command imports what it runs only when it runs: `hetrl --help`, a typo and the
# torch-free commands answer at once, and none loads another's heavy dependencies
# (torch, the sagemaker SDK, matplotlib).


@dataclasses.dataclass(frozen=True)
class Deferred:
    """A command that imports `module:function` when it runs, and calls it."""

    target: str

    def resolve(self) -> Callable[[Any], int]:
        module, _, function = self.target.partition(":")
        return getattr(importlib.import_module(module), function)

    def __call__(self, settings: Any) -> int:
        return self.resolve()(settings)


def _local(settings: LocalSettings, given: set[str] | None = None, resumed: str = "") -> int:
    # The first line, before the heavy imports and the env check: what is starting.
    print(f"hetrl local: {settings.env}, {settings.workers} workers x "
          f"{settings.envs_per_worker} envs, {settings.total_steps:,} env steps, seed "
          f"{settings.seed}; starting ...", file=sys.stderr, flush=True)
    if resumed:
        print(f"hetrl: {resumed}", file=sys.stderr, flush=True)
    from hetrl.launch.local import run_prepared
    from hetrl.launch.presets import announce, apply_preset

    settings, line = apply_preset(settings, given)  # what you gave wins over the preset
    announce(line)
    result = run_prepared(settings, started=_process_start())
    for line in result.outcome_lines():  # the command's result: stdout, the rest stderr
        print(f"hetrl: {line}")
    return result.exit_code


def _process_start() -> float:
    """When this command started (Unix time), interpreter start-up and imports included."""
    import psutil

    return psutil.Process().create_time()


def _emulate(settings: EmulateSettings) -> int:
    from hetrl.launch.emulate import report, run_emulated

    result = run_emulated(settings)
    print(report(result))  # the command's result on stdout, the hosts' lines on stderr
    return result.exit_code


def _report(settings: ReportSettings) -> int:
    from hetrl.launch.report import compare, write_report

    types = list(settings.instance_type) + [""] * (2 - len(settings.instance_type))
    prices = settings.prices or None
    for run, kind in zip(settings.runs, types, strict=False):
        print(f"report: {write_report(Path(run), kind, prices)}")
    if len(settings.runs) == 2:
        print(compare(Path(settings.runs[0]), Path(settings.runs[1]), types[0], types[1],
                      prices, settings.target_return))
    return 0


def _enjoy(settings: EnjoySettings) -> int:
    from hetrl.rollout.evaluate import describe_model, evaluate, load_policy
    from hetrl.rollout.models import model_file

    which = settings.which
    if which == "best" and Path(settings.run).is_dir():
        try:
            model_file(settings.run, "best")
        except ConfigError as exc:  # a run that kept no best: its final policy, said so
            print(f"hetrl enjoy: {exc}; playing the final one", file=sys.stderr)
            which = "final"
    trained = load_policy(settings.run, which)
    mode = "deterministic" if settings.deterministic else "sampled"
    print(f"hetrl enjoy: {trained.env.env}, {describe_model(trained)}, {settings.episodes} "
          f"episodes, {mode} actions", file=sys.stderr)
    result = evaluate(trained, settings.episodes, settings.deterministic, settings.seed,
                      settings.video or None)
    print(result.summary())
    for video in result.videos:
        print(f"video: {video}")
    return 0


def _plan(settings: PlanSettings) -> int:
    from hetrl.launch.plan import run_plan

    print(run_plan(settings))
    return 0


def _worker(settings: WorkerSettings) -> int:
    """A worker process: it runs the policy (worker inference) or only the envs (central;
    that one imports no torch)."""
    if settings.inference == "central":
        from hetrl.rollout.env_server import run_env_server

        return run_env_server(settings)
    from hetrl.rollout.worker import run_worker

    return run_worker(settings)


def _launch(settings: ClusterSettings) -> int:  # dispatched in main(), see there
    raise AssertionError("hetrl launch is dispatched by launch.host.main")


COMMANDS: dict[str, tuple[type, Callable[[Any], int]]] = {
    "local": (LocalSettings, _local),
    "launch": (ClusterSettings, _launch),
    "emulate": (EmulateSettings, _emulate),
    "submit": (SubmitSettings, Deferred("hetrl.launch.submit:run_submit")),
    "fetch": (FetchSettings, Deferred("hetrl.launch.jobs:run_fetch")),
    "report": (ReportSettings, _report),
    "enjoy": (EnjoySettings, _enjoy),
    "plan": (PlanSettings, _plan),
    "worker": (WorkerSettings, _worker),
    "learner": (LearnerSettings, Deferred("hetrl.learner.learner:run_learner")),
}


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:
        # The reader went away (`hetrl local --help | head`): stop quietly, as shell tools
        # do; stdout goes to /dev/null so the interpreter's final flush cannot complain.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool that met a closed pipe


CONFIG_HELP = ("--config FILE: settings from a JSON or YAML file (a previous run's "
               "settings.json works as is); flags on the command line override it.")


def _split_config(args: list[str]) -> tuple[str, list[str]]:
    """Take `--config FILE` (or `--config=FILE`) out of the arguments."""
    for i, arg in enumerate(args):
        if arg == "--config":
            if i + 1 >= len(args):
                raise ConfigError("--config needs a file")
            return args[i + 1], args[:i] + args[i + 2:]
        if arg.startswith("--config="):
            return arg.partition("=")[2], args[:i] + args[i + 1:]
    return "", args


def _main(args: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    user_modules_importable()  # --env my_pkg.envs:Maze from this folder, as python -m
    if args[:1] == ["launch"] and not {"-h", "--help"} & set(args):
        # Defaults come from the job's hyperparameters, so the host entry point parses.
        from hetrl.launch.host import main as host_main

        return host_main(args[1:])
    if args[:1] and args[0] in COMMANDS:
        # Parsed as its own program, so that tyro's hints say `hetrl local --help`.
        name = args[0]
        cls, run = COMMANDS[name]
        try:
            config, rest = _split_config(args[1:])
            from_file = config_values(config, cls) if config else {}
            default = cls(**from_file) if config else None
            settings = flags.parse(cls, rest, prog=f"hetrl {name}", default=default,
                                   description=f"{cls.__doc__}\n\n{CONFIG_HELP}")
            if cls is LocalSettings:  # flags and the config file win over the preset
                given = flags_given(rest, cls) | set(from_file)
                settings, given, resumed = resume_settings(settings, given)
                return _local(settings, given, resumed)
            return run(settings)
        except HetrlError as exc:
            print(f"hetrl {name}: error: {exc}\n(hetrl {name} --help lists every flag)",
                  file=sys.stderr)
            return 2
    tyro.extras.subcommand_cli_from_dict(  # no command yet: help, or an error naming them
        {name: cls for name, (cls, _) in COMMANDS.items()},
        prog="hetrl",
        description="Distributed RL: env workers on CPUs stream to a learner over gRPC.",
        args=args,
    )
    raise AssertionError("tyro returns only for a known command")


if __name__ == "__main__":
    raise SystemExit(main())
