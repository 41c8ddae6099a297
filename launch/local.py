"""`hetrl local` and `launch.run_local`: workers and a learner as processes on one machine.

The launcher checks the settings and the env before spawning anything, starts the
workers (each binds a free loopback port and reports it in a ready file), starts the
learner with their addresses, and supervises: the run succeeds when the learner exits
0 (its outputs are then complete); workers still running after it are stopped. A worker
that crashes, is killed or hangs during training is restarted on its port by the
workers' supervisor (launch.supervisor, at most MAX_WORKER_RESTARTS times in the run)
and the learner's stream reconnects to it; none is restarted once the learner has begun
to stop; a worker whose env keeps failing (exit code unhealthy), a failing learner,
Ctrl-C or SIGTERM stop every child (SIGTERM, then SIGKILL after a grace) and the
launcher exits non-zero, except after a SIGTERM that every child honoured (exit 0).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hetrl.launch.evaluator import finish_evaluations, start_evaluator
from hetrl.launch.hyperparameters import check_names
from hetrl.launch.presets import announce, apply_preset, changed_fields
from hetrl.launch.processes import Child, child_environment, spawn, stop_all
from hetrl.launch.settings import LocalSettings
from hetrl.launch.supervisor import Supervisor
from hetrl.learner.metrics import TRACK_NEEDS
from hetrl.learner.settings import LearnerSettings, default_run_dir
from hetrl.rollout.envs import describe_env
from hetrl.rollout.errors import ChildFailedError, ConfigError
from hetrl.rollout.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from hetrl.rollout.settings import WorkerSettings, pick
from hetrl.rollout.transport import new_token

log = logging.getLogger("hetrl.launch")


@dataclasses.dataclass
class RunResult:
    """What a local run produced."""

    exit_code: int
    out: Path
    summary: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def model_path(self) -> Path:
        return self.out / "model.safetensors"

    def policy(self):
        """The trained policy, ready to act (hetrl.rollout.evaluate.TrainedPolicy).

        Raises:
            ConfigError: the run saved no model.
        """
        from hetrl.rollout.evaluate import load_policy

        return load_policy(self.out)


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _env_name(env: Any) -> str:
    """Accept an env class or factory as well as a string, as `module:qualname`."""
    if isinstance(env, str):
        return env
    module, name = getattr(env, "__module__", None), getattr(env, "__qualname__", None)
    if not module or not name or module == "__main__" or "<locals>" in name:
        raise ConfigError(
            f"{env!r} must live in an importable module (not __main__ or a function body): "
            "worker processes import it by name. Move it to my_pkg/my_mod.py and pass "
            "env='my_pkg.my_mod:MyEnv'."
        )
    return f"{module}:{name}"


def run_local(settings: LocalSettings | None = None, **overrides: Any) -> RunResult:
    """Train locally: workers and a learner as separate processes over loopback gRPC.

    Args:
        settings: a LocalSettings (typed, and completed by an editor); or leave it out and
            pass its fields as keywords, e.g. run_local(env="my_pkg.envs:Maze", workers=2,
            total_steps=100_000); a mistyped keyword gets a "did you mean".
            `env` may also be the env class itself if it lives in an importable module.

    The env's preset (--preset, auto by default: see launch.presets) fills every
    setting not given as a keyword, or, for a LocalSettings object, left at its shipped
    default (preset="none" uses the object as it is).

    Returns:
        RunResult with the exit code, the output directory, the learner's summary, and
        `policy()` for the trained policy.

    Raises:
        ConfigError, EnvError: bad settings or an env that cannot be made, before any
            process starts.
    """
    if "env" in overrides:
        overrides["env"] = _env_name(overrides["env"])
    check_names(overrides, LocalSettings, "run_local setting")
    if settings is None:
        base, explicit = LocalSettings(**overrides), set(overrides)
    else:
        base = dataclasses.replace(settings, **overrides)
        explicit = changed_fields(base) | set(overrides)
    prepared, line = apply_preset(base, explicit)
    announce(line)
    return run_prepared(prepared)


def run_prepared(settings: LocalSettings) -> RunResult:
    """run_local for settings whose preset is already applied (by the CLI, which knows
    the flags given): the settings are used as they are."""
    describe_env(settings)  # fail here, before anything is spawned
    if settings.track and importlib.util.find_spec("wandb") is None:
        raise ConfigError(TRACK_NEEDS)
    out = prepare_out_dir(settings)
    settings = dataclasses.replace(settings, out=str(out))
    if settings.instance_type:  # what the report prices this machine as
        instances = [{"group": "local", "instance_type": settings.instance_type, "count": 1}]
        (out / "cluster.json").write_text(json.dumps({"instances": instances}))
    code = _supervise(settings, out / "launch")
    if (out / "summary.json").exists():
        from hetrl.launch.report import try_write_report

        try_write_report(out, settings.instance_type)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return RunResult(code, out, summary)


# What a directory holds when a hetrl run wrote it (--overwrite deletes nothing else).
_RUN_MARKERS = ("settings.json", "summary.json", "metrics.jsonl", "model.safetensors", "launch")


def prepare_out_dir(settings: LocalSettings) -> Path:
    """The run's output directory, created and writable: --out, or a new one per run.

    A directory that already holds files is refused unless --resume continues the run in
    it or --overwrite deletes the previous run's outputs first (only if it holds a hetrl
    run: hetrl deletes nothing else), so two runs never mix their metrics.

    Raises:
        ConfigError: the directory holds files and neither flag says what to do, or it
            cannot be created or written.
    """
    out = Path(settings.out or default_run_dir(settings.env, settings.seed))
    if settings.resume and settings.overwrite:
        raise ConfigError("--resume continues the run in --out, --overwrite starts it again: "
                          "give one of them")
    if out.is_dir() and any(out.iterdir()):
        is_run = any((out / name).exists() for name in _RUN_MARKERS)
        if settings.overwrite and is_run:
            log.info("--overwrite: deleting the previous run in %s", out)
            shutil.rmtree(out)
        elif settings.overwrite:
            raise ConfigError(f"--out {out} holds files that no hetrl run wrote; hetrl will "
                              "not delete them: choose another directory")
        elif not settings.resume:
            what = "a previous run" if is_run else "files"
            raise ConfigError(
                f"--out {out} already holds {what}: pass --resume to continue it, --overwrite "
                "to start it again, or choose a new directory (without --out every run gets "
                "its own, runs/<env>__seed<seed>__<date-time>)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create or write the output directory "
                          f"({exc.strerror or exc}); choose a directory you can write") from exc
    return out


def _supervise(settings: LocalSettings, run_dir: Path) -> int:
    env = child_environment(new_token())
    workers = Supervisor(
        lambda i, port, ready: pick(WorkerSettings, settings, worker_id=i, host="127.0.0.1",
                                    port=port, ready_file=ready),
        run_dir, env)
    learner: Child | None = None
    evaluator: Child | None = None

    def children() -> list[Child]:  # stopped together: the learner checkpoints meanwhile
        return [*workers.workers, *([learner] if learner is not None else [])]

    def on_signal(signum, _frame):
        raise _Interrupted(signum)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    in_main = _is_main_thread()
    if in_main:
        for s in previous:
            signal.signal(s, on_signal)
    try:
        addresses = workers.start_and_wait(settings.workers, settings.startup_timeout)
        finishing = run_dir / "learner.finishing"
        finishing.unlink(missing_ok=True)
        learner_settings = pick(LearnerSettings, settings, worker_addresses=tuple(addresses),
                                finishing_file=str(finishing))
        learner = spawn("learner", "hetrl.learner.learner", learner_settings, run_dir, env,
                        log_to_file=False)
        if settings.eval_every:
            evaluator = start_evaluator(Path(settings.out), settings.eval_episodes,
                                        settings.seed, run_dir, env)
        code = _watch(workers, learner, finishing, settings.shutdown_grace)
        if evaluator is not None and code == EXIT_OK:
            finish_evaluations(evaluator, Path(settings.out), settings.shutdown_grace)
        return code
    except _Interrupted as exc:
        print(f"\nhetrl: {exc} received; stopping all processes", file=sys.stderr)
        stop_all(children(), settings.shutdown_grace)
        if exc.signum == signal.SIGTERM and all(c.exit_code() == 0 for c in children()):
            # A stop (SageMaker's, a scheduler's) that every child honoured: the learner
            # checkpointed and saved its model, so the stop itself succeeded.
            return EXIT_OK
        return EXIT_INTERRUPTED
    except ChildFailedError as exc:
        print(f"hetrl: {exc}", file=sys.stderr)
        stop_all(children(), settings.shutdown_grace)
        return EXIT_FAILED
    finally:
        stop_all(children(), settings.shutdown_grace)  # no-op when all have exited
        if evaluator is not None:
            stop_all([evaluator], settings.shutdown_grace)
        if in_main:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _watch(workers: Supervisor, learner: Child, finishing: Path, grace: float) -> int:
    """Wait for the learner while `workers` restarts those that crash; on its success,
    let the workers finish (launch.supervisor) and return EXIT_OK.

    Once the learner has begun to stop (it creates `finishing` first) or has exited,
    nothing is restarted: a worker born then would wait for a learner that never comes.

    Raises:
        ChildFailedError: the learner failed, or a worker did (Supervisor.poll).
    """

    def training() -> bool:
        return not finishing.exists() and learner.exit_code() is None

    while (code := learner.exit_code()) is None:
        workers.poll(may_restart=training)
        time.sleep(0.1)
    if code != EXIT_OK:
        raise ChildFailedError(f"the learner exited with code {code}; see its output above")
    workers.finish(grace)
    return EXIT_OK


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
