"""The `hetrl` command. Subcommands and flags are generated from the settings dataclasses
(one per role), so each flag is documented once, where its field is defined."""

from __future__ import annotations

import logging
import sys

import tyro

from hetrl.launch.emulate import EmulateSettings
from hetrl.launch.jobs import FetchSettings
from hetrl.launch.plan import PlanSettings
from hetrl.launch.settings import ClusterSettings, LocalSettings, ReportSettings
from hetrl.launch.submit import SubmitSettings  # imports no SDK; it loads only when used
from hetrl.learner.settings import LearnerSettings
from hetrl.rollout.errors import HetrlError
from hetrl.rollout.settings import WorkerSettings


def _local(settings: LocalSettings) -> int:
    from hetrl.launch.local import run_local

    result = run_local(settings)
    if result.ok:
        print(f"hetrl: done; model and metrics in {result.out}", file=sys.stderr)
    return result.exit_code


def _worker(settings: WorkerSettings) -> int:
    from hetrl.rollout.worker import run_worker

    return run_worker(settings)


def _learner(settings: LearnerSettings) -> int:
    from hetrl.learner.learner import run_learner

    return run_learner(settings)


def _emulate(settings: EmulateSettings) -> int:
    from hetrl.launch.emulate import report, run_emulated

    result = run_emulated(settings)
    print(report(result), file=sys.stderr)
    return result.exit_code


def _submit(settings: SubmitSettings) -> int:
    from hetrl.launch.submit import run_submit

    return run_submit(settings)


def _fetch(settings: FetchSettings) -> int:
    from hetrl.launch.jobs import run_fetch

    return run_fetch(settings)


def _report(settings: ReportSettings) -> int:
    from pathlib import Path

    from hetrl.launch.report import compare, write_report

    types = list(settings.instance_type) + [""] * (2 - len(settings.instance_type))
    prices = settings.prices or None
    for run, kind in zip(settings.runs, types, strict=False):
        print(f"report: {write_report(Path(run), kind, prices)}")
    if len(settings.runs) == 2:
        print(compare(Path(settings.runs[0]), Path(settings.runs[1]), types[0], types[1],
                      prices))
    return 0


def _plan(settings: PlanSettings) -> int:
    from hetrl.launch.plan import run_plan

    print(run_plan(settings))
    return 0


def _launch(settings: ClusterSettings) -> int:  # dispatched in main(), see there
    raise AssertionError("hetrl launch is dispatched by launch.host.main")


COMMANDS = {
    "local": (LocalSettings, _local),
    "launch": (ClusterSettings, _launch),
    "emulate": (EmulateSettings, _emulate),
    "submit": (SubmitSettings, _submit),
    "fetch": (FetchSettings, _fetch),
    "report": (ReportSettings, _report),
    "plan": (PlanSettings, _plan),
    "worker": (WorkerSettings, _worker),
    "learner": (LearnerSettings, _learner),
}


def _user_modules_importable() -> None:
    """Let `--env my_pkg.envs:Maze` import from the current directory, as `python -m`
    does, but after hetrl's own modules and every installed package (the `hetrl` script,
    unlike `python -m`, does not put the current directory on the path)."""
    import os

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = sys.argv[1:] if argv is None else argv
    _user_modules_importable()
    if args[:1] == ["launch"] and not {"-h", "--help"} & set(args):
        # Defaults come from the job's hyperparameters, so the host entry point parses.
        from hetrl.launch.host import main as host_main

        return host_main(args[1:])
    try:
        settings = tyro.extras.subcommand_cli_from_dict(
            {name: cls for name, (cls, _) in COMMANDS.items()},
            prog="hetrl",
            description="Distributed RL: env workers on CPUs stream to a learner over gRPC.",
            args=args,
        )
        for _, (cls, run) in COMMANDS.items():
            if type(settings) is cls:
                return run(settings)
        raise AssertionError(f"no command for {type(settings).__name__}")
    except HetrlError as exc:
        print(f"hetrl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
