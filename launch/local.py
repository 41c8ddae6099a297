"""`hetrl local` and `launch.run_local`: workers and a learner as processes on one machine.

The launcher checks the settings and the env before spawning anything, starts the
workers (each binds a free loopback port and reports it in a ready file), starts the
learner with their addresses, and supervises: the run succeeds when the learner exits
0 (its outputs are then complete); workers still running after it are stopped. A worker
that crashes, is killed or hangs during training is restarted on its port (at most
MAX_WORKER_RESTARTS times in the run) and the learner's stream reconnects to it; none is
restarted once the learner has begun to stop; a worker whose env keeps failing (exit
code unhealthy), a failing learner, Ctrl-C or SIGTERM stop every child (SIGTERM, then
SIGKILL after a grace) and the launcher exits non-zero.
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
import time
from pathlib import Path
from typing import Any

from hetrl.launch.presets import announce, apply_preset, changed_fields
from hetrl.launch.processes import (
    MAX_WORKER_RESTARTS,
    WORKER_EXIT_UNHEALTHY,
    Child,
    child_environment,
    restartable,
    spawn,
    stop_all,
    wait_all,
    wait_ready_file,
)
from hetrl.launch.settings import LocalSettings
from hetrl.learner.metrics import TRACK_NEEDS
from hetrl.learner.settings import LearnerSettings, default_run_dir
from hetrl.rollout.envs import describe_env
from hetrl.rollout.errors import ChildFailedError, ConfigError
from hetrl.rollout.settings import SNAPSHOT_GLOB, EvaluatorSettings, WorkerSettings, pick
from hetrl.rollout.transport import new_token

log = logging.getLogger("hetrl.launch")

EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 130  # 130: Ctrl-C, as shells report it


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
    _check_keywords(overrides)
    if settings is None:
        settings, explicit = LocalSettings(**overrides), set(overrides)
    else:
        settings = dataclasses.replace(settings, **overrides)
        explicit = changed_fields(settings) | set(overrides)
    settings, line = apply_preset(settings, explicit)
    announce(line)
    return run_prepared(settings)


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


def _finish_evaluations(evaluator: Child, folder: Path, timeout: float) -> None:
    """Give the evaluator up to `timeout` s to play the learner's final snapshot, so the
    report shows how the final policy does; then it is stopped like every child."""
    deadline = time.monotonic() + timeout
    while (time.monotonic() < deadline and evaluator.exit_code() is None
           and any(folder.glob(SNAPSHOT_GLOB))):
        time.sleep(0.1)


def _check_keywords(overrides: dict[str, Any]) -> None:
    """Refuse keywords that are not LocalSettings fields, naming the nearest ones."""
    import difflib

    names = sorted(f.name for f in dataclasses.fields(LocalSettings))
    for key in overrides:
        if key not in names:
            near = difflib.get_close_matches(key, names, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ConfigError(f"run_local: unknown setting {key!r}{hint} (LocalSettings "
                              "lists them all)")


def _supervise(settings: LocalSettings, run_dir: Path) -> int:
    env = child_environment(new_token())
    children: list[Child] = []
    evaluator: Child | None = None

    def on_signal(signum, _frame):
        raise _Interrupted(signum)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    in_main = _is_main_thread()
    if in_main:
        for s in previous:
            signal.signal(s, on_signal)
    try:
        addresses = []
        for i in range(settings.workers):
            ready = run_dir / f"worker-{i}.ready"
            ready.unlink(missing_ok=True)
            worker = pick(WorkerSettings, settings, worker_id=i, host="127.0.0.1", port=0,
                          ready_file=str(ready))
            children.append(spawn(f"worker-{i}", "hetrl.rollout.worker", worker, run_dir, env))
        for i, child in enumerate(children):
            addresses.append(
                wait_ready_file(child, run_dir / f"worker-{i}.ready", settings.startup_timeout)
            )
        finishing = run_dir / "learner.finishing"
        finishing.unlink(missing_ok=True)
        learner_settings = pick(LearnerSettings, settings, worker_addresses=tuple(addresses),
                                finishing_file=str(finishing))
        learner = spawn("learner", "hetrl.learner.learner", learner_settings, run_dir, env,
                        log_to_file=False)
        children.append(learner)
        if settings.eval_every:  # beside the run, never supervised as a worker
            evaluator = spawn("evaluator", "hetrl.rollout.evaluate", EvaluatorSettings(
                eval_dir=str(Path(settings.out) / "eval"),
                eval_episodes=settings.eval_episodes, seed=settings.seed), run_dir, env)

        def restart(i: int) -> Child:
            port = int(addresses[i].rsplit(":", 1)[1])
            worker = pick(WorkerSettings, settings, worker_id=i, host="127.0.0.1", port=port,
                          ready_file="")
            return spawn(f"worker-{i}", "hetrl.rollout.worker", worker, run_dir, env)

        code = _watch(children, learner, settings, restart, finishing)
        if evaluator is not None and code == EXIT_OK:
            _finish_evaluations(evaluator, Path(settings.out) / "eval", settings.shutdown_grace)
        return code
    except _Interrupted as exc:
        print(f"\nhetrl: {exc} received; stopping all processes", file=sys.stderr)
        stop_all(children, settings.shutdown_grace)
        if exc.signum == signal.SIGTERM and all(c.exit_code() == 0 for c in children):
            # A stop (SageMaker's, a scheduler's) that every child honoured: the learner
            # checkpointed and saved its model, so the stop itself succeeded.
            return EXIT_OK
        return EXIT_INTERRUPTED
    except ChildFailedError as exc:
        print(f"hetrl: {exc}", file=sys.stderr)
        stop_all(children, settings.shutdown_grace)
        return EXIT_ERROR
    finally:
        stop_all(children, settings.shutdown_grace)  # no-op when all have exited
        if evaluator is not None:
            stop_all([evaluator], settings.shutdown_grace)
        if in_main:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _watch(children: list[Child], learner: Child, settings: LocalSettings, restart,
           finishing: Path) -> int:
    """Wait for the learner, restarting crashed workers in `children` in place.

    Once the learner has begun to stop (it creates `finishing` first) or has exited,
    nothing is restarted: a worker born then would wait for a learner that never comes.
    """
    workers = [i for i, c in enumerate(children) if c is not learner]
    restarts = 0
    while True:
        code = learner.exit_code()
        if code is not None:
            if code != 0:
                raise ChildFailedError(f"the learner exited with code {code}; see its output above")
            _end_workers([children[i] for i in workers], settings.shutdown_grace)
            return EXIT_OK
        for i in workers:
            # Exit 0 is a worker the learner (or an operator) stopped; the learner
            # carries on with the others or reports that none is left.
            worker = children[i]
            code = worker.exit_code()
            if code == WORKER_EXIT_UNHEALTHY:
                raise ChildFailedError(
                    f"{worker.name} is unhealthy: its env kept failing after being recreated "
                    f"(--env-failure-rate {settings.env_failure_rate} over "
                    f"--env-failure-window {settings.env_failure_window}). Fix the env; its "
                    f"last error:\n{worker.log_tail()}"
                )
            if not restartable(code):
                continue
            if finishing.exists() or learner.exit_code() is not None:
                break  # training is over: the learner's exit is handled at the top
            restarts += 1
            if restarts > MAX_WORKER_RESTARTS:
                raise ChildFailedError(
                    f"{worker.name} exited with code {code} during training, after "
                    f"{MAX_WORKER_RESTARTS} worker restarts in this run:\n{worker.log_tail()}"
                )
            print(f"hetrl: {worker.name} exited with code {code}; restarting it "
                  f"({restarts}/{MAX_WORKER_RESTARTS})", file=sys.stderr)
            children[i] = restart(i)
        time.sleep(0.1)


# After the learner's Stop, a healthy worker exits within its server's 2 s grace.
_STOPPED_WORKER_EXIT = 5.0


def _end_workers(workers: list[Child], grace: float) -> None:
    """The learner finished: the run's outputs are complete. Workers it stopped exit by
    themselves; any still running then (one that crashed or hung near the end and never
    heard the Stop) gets SIGTERM, then SIGKILL after `grace`. A worker's exit after the
    learner's success is reported, never a failure of the run."""
    wait_all(workers, min(grace, _STOPPED_WORKER_EXIT))
    late = [w for w in workers if w.exit_code() is None]
    if late:
        print(f"hetrl: {', '.join(w.name for w in late)} still running after the learner "
              "finished; stopping them", file=sys.stderr)
        stop_all(late, grace)
    for worker in workers:
        code = worker.exit_code()
        if code not in (0, None) and worker not in late:
            print(f"hetrl: note: {worker.name} exited with code {code} as training ended "
                  "(the model and metrics are complete)", file=sys.stderr)


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
