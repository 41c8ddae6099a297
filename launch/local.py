"""`hetrl local` and `launch.run_local`: workers and a learner as processes on one machine.

The launcher checks the settings and the env before spawning anything, starts the
learner and the workers (each binds a free loopback port and reports it in a ready
file; the learner waits for their addresses), and supervises: the run succeeds when the
learner exits 0 (its outputs are then complete); workers still running after it are
stopped. A worker that crashes, is killed or hangs during training is restarted on its
port by the workers' supervisor (launch.supervisor: for as long as its incarnations
deliver experience, with back-off) and the learner's stream reconnects to it; none is
restarted once the learner has begun to stop. A worker whose env keeps failing (exit
code unhealthy) or that cannot live long enough to deliver anything, or a failing
learner, stop every child (the learner first, so it saves) and the launcher exits 1,
with the cause as the run's outcome.
Ctrl-C or SIGTERM reach the launcher alone (children run in their own sessions): it
passes the stop to the learner, which saves its model and a checkpoint and stops its
workers, then stops what is left; it exits 130, or 0 after a SIGTERM every child
honoured. A second Ctrl-C kills every child at once. The command's settings go to
<out>/settings.json, and where its wall time went (start-up, training, stop, report)
to the summary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from hetrl.launch.config import (
    check_resume,
    resume_settings,
    saved_settings,
    write_json,
    write_settings,
)
from hetrl.launch.evaluator import finish_evaluations, start_evaluator
from hetrl.launch.hyperparameters import check_names
from hetrl.launch.presets import announce, apply_preset, changed_fields
from hetrl.launch.processes import Child, child_environment, kill_all, spawn, stop_all
from hetrl.launch.settings import LocalSettings
from hetrl.launch.supervisor import Supervisor
from hetrl.learner.metrics import TRACK_NEEDS
from hetrl.learner.settings import LearnerSettings, default_run_dir
from hetrl.rollout.envs import EnvDescription, describe_env
from hetrl.rollout.errors import ChildFailedError, ConfigError, OutputError
from hetrl.rollout.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from hetrl.rollout.models import BEST_MODEL_FILE, best_info
from hetrl.rollout.observations import ObsLayout
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
        """Whether the run ended by itself (exit code 0)."""
        return self.exit_code == 0

    @property
    def model_path(self) -> Path:
        """The final model (model.safetensors in the run's directory)."""
        return self.out / "model.safetensors"

    def outcome_lines(self) -> list[str]:
        """What the command says at its end: how it ended, where its wall time went,
        where the outputs are, and how to continue a run that was stopped."""
        s = self.summary
        if not s:
            return [] if self.ok else [f"nothing was trained (its logs are in {self.out}); "
                                       "fix the cause above and run again"]
        timing = s.get("timing", {})
        parts = [f"{name} {_seconds(timing.get(key))}" for name, key in (
            ("start-up", "startup_seconds"), ("training", "training_seconds"),
            ("stop", "stop_seconds"), ("report", "report_seconds")) if timing.get(key)]
        took = f" in {_seconds(timing.get('command_seconds'))}" if timing else ""
        took += f" ({', '.join(parts)})" if parts else ""
        mean = s.get("mean_return_100")
        figures = f"{s.get('global_step', 0):,} env steps" + (
            f", mean return(100) {mean:,.1f}" if mean is not None else "")
        best = s.get("best")
        if best:
            figures += (f", best {best['mean_return']:,.1f} at step "
                        f"{best['global_step']:,}")
        outcome = str(s.get("outcome", ""))
        lines = [f"{outcome}{took}: {figures}"]
        lines.append(f"model and metrics in {self.out}" + (
            "; `hetrl enjoy` plays the best policy, `--which final` the last"
            if best else ""))
        if outcome.startswith("failed"):
            lines.append(f"to continue this run once the cause is fixed: hetrl local --out "
                         f"{self.out} --resume")
        elif outcome.startswith("stopped") or self.exit_code != 0:
            lines.append(f"to continue this run: hetrl local --out {self.out} --resume")
        return lines

    def policy(self, which: str = "final"):
        """The trained policy, ready to act (hetrl.rollout.evaluate.TrainedPolicy):
        the final one, or (which="best") the best the run kept.

        Raises:
            ConfigError: the run saved no such model.
        """
        from hetrl.rollout.evaluate import load_policy

        return load_policy(self.out, which)


class _LearnerFailed(ChildFailedError):
    """The learner exited non-zero: its own summary (if any) says why."""


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
        The run's exit code, output directory and learner's summary, and `policy()` for
        the trained policy.

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
    base, explicit, resumed = resume_settings(base, explicit)
    if resumed:
        announce(resumed)
    prepared, line = apply_preset(base, explicit)
    announce(line)
    return run_prepared(prepared)


def run_prepared(settings: LocalSettings, started: float | None = None) -> RunResult:
    """run_local for settings whose preset is already applied (by the CLI, which knows
    the flags given): the settings are used as they are. `started`: when the command
    started (Unix time; default now), for the summary's account of its wall time."""
    started = time.time() if started is None else started
    spaces = describe_env(settings)  # fail here, before anything is spawned
    if settings.track and importlib.util.find_spec("wandb") is None:
        raise ConfigError(TRACK_NEEDS)
    if settings.inference == "central" and settings.credits_per_worker != 1:
        # What the learner does anyway (policy lag 0 or 1); recorded as it runs.
        settings = dataclasses.replace(settings, credits_per_worker=1)
    check_budget(settings, spaces)
    check_learner_devices(settings)
    out = prepare_out_dir(settings)
    settings = dataclasses.replace(settings, out=str(out))
    write_settings(out, settings)  # so that --config reruns it and --resume continues it
    if settings.instance_type:  # what the report prices this machine as
        instances = [{"group": "local", "instance_type": settings.instance_type, "count": 1}]
        (out / "cluster.json").write_text(json.dumps({"instances": instances}))
    events = _Events()  # what the launcher saw: a cause it ended the run for, restarts
    code = _supervise(settings, out / "launch", events)
    summary = _account_time(out, started, events)
    if summary and settings.report and code != EXIT_INTERRUPTED:
        from hetrl.launch.report import try_write_report

        say("writing the report (--no-report skips it) ...")
        report_start = time.time()
        try_write_report(out, settings.instance_type)
        summary["timing"]["report_seconds"] = round(time.time() - report_start, 2)
        with contextlib.suppress(OutputError):  # said already, if the disk is full
            write_json(out / "summary.json", summary)
    return RunResult(code, out, summary)


@dataclasses.dataclass
class _Events:
    """What the launcher saw of a run that the learner cannot know."""

    failure: str | None = None
    """Why the launcher ended the run (a worker that cannot live), if it did."""
    worker_restarts: int = 0


def _account_time(out: Path, started: float, events: _Events) -> dict[str, Any]:
    """Add to summary.json where this command's wall time went (start-up until the
    learner's first update, training, the stop) and the workers' restarts; when the
    launcher ended the run, its cause becomes the outcome and the verdict instead of the
    learner's "stopped: signal SIGTERM"; a verdict that asks for more workers while
    workers kept dying says to fix that first. Return the summary ({} if none)."""
    path = out / "summary.json"
    if not path.exists():
        return {}
    summary = json.loads(path.read_text())
    if (summary.get("ended_unix") or 0) < started:  # a resumed run's, not this command's
        return {}
    summary["worker_restarts"] = events.worker_restarts
    if events.failure is not None:
        first = events.failure.strip().splitlines()[0]
        summary["outcome"] = f"failed: {first}"
        summary["verdict"], summary["verdict_text"] = "failed", first
    elif events.worker_restarts and summary.get("verdict") == "experience-bound":
        summary["verdict_text"] = (f"{summary.get('verdict_text', '')}; but workers were "
                                   f"restarted {events.worker_restarts} times: fix what "
                                   "ends them before adding more")
    now = time.time()
    first = summary.get("first_update_unix")
    ended = summary.get("training_ended_unix") or summary.get("ended_unix")
    timing: dict[str, float | None] = {"command_seconds": round(now - started, 2)}
    timing["startup_seconds"] = round(first - started, 2) if first else None
    timing["training_seconds"] = round(ended - first, 2) if first and ended else None
    timing["stop_seconds"] = round(now - ended, 2) if ended else None
    summary["timing"] = timing
    # The evaluator may have kept a better policy after the learner wrote its summary.
    summary["best"] = best_info(out / BEST_MODEL_FILE)
    try:
        write_json(path, summary)
    except OutputError as exc:  # the learner's summary stands; these figures are printed
        say(f"{exc}; the summary keeps the learner's figures")
    return summary


def check_budget(settings: LocalSettings, spaces: EnvDescription) -> None:
    """Refuse settings whose first batch alone would spend the step budget, and warn when
    the run would train only a few updates or its experience would not fit in memory.

    Raises:
        ConfigError: one batch holds more env steps than --total-steps.
    """
    fragment = settings.envs_per_worker * settings.fragment_length
    batch = settings.batch_fragments(settings.workers) * fragment
    fix = ("lower --envs-per-worker or --fragment-length (one fragment is envs per worker "
           "x fragment length steps), or raise --total-steps")
    if batch > settings.total_steps:
        raise ConfigError(
            f"one training batch holds {batch:,} env steps ({settings.workers} workers x "
            f"{settings.envs_per_worker} envs x {settings.fragment_length} steps), more than "
            f"--total-steps {settings.total_steps:,}: the run would end before it trained; "
            f"{fix}")
    updates = settings.total_steps // batch
    if updates < MIN_UPDATES:
        say(f"warning: only {updates} updates fit in --total-steps {settings.total_steps:,} "
            f"with batches of {batch:,} env steps; {fix}")
    memory = _experience_bytes(settings, spaces, fragment)
    available = psutil.virtual_memory().available
    if memory > 0.5 * available:
        say(f"warning: the fragments in flight and in training take about "
            f"{memory / 2**30:.1f} GiB of the {available / 2**30:.1f} GiB available; {fix}")


def check_learner_devices(settings: LocalSettings) -> None:
    """Refuse a learner group on CUDA with more ranks than GPUs: NCCL runs one rank per
    GPU, and two ranks on one fail only once the group meets.

    Raises:
        ConfigError: --learners exceeds the GPUs --device would use.
    """
    if settings.learners == 1 or settings.device == "cpu":
        return
    import torch

    gpus = torch.cuda.device_count()
    if (settings.device != "auto" or gpus) and settings.learners > gpus:
        raise ConfigError(f"--learners {settings.learners} on CUDA needs a GPU per rank and "
                          f"this machine has {gpus}: lower --learners to {max(gpus, 1)}, or "
                          "train the ranks on CPU with --device cpu (gloo)")


MIN_UPDATES = 10
"""Fewer updates than this in a run's budget gets a warning: PPO learns little in so few."""


def _experience_bytes(settings: LocalSettings, spaces: EnvDescription,
                      fragment_steps: int) -> float:
    """About how many bytes of experience a run holds at once: each worker's fragments in
    flight (its credits, once in the worker and once decoded by the learner) and the
    learner's two batch slots."""
    step_bytes = ObsLayout.of(spaces.observation_space).nbytes + 32
    fragments = (2 * settings.workers * settings.credits_per_worker
                 + 2 * settings.batch_fragments(settings.workers))
    return fragments * fragment_steps * step_bytes


# What a directory holds when a hetrl run wrote it (--overwrite deletes nothing else).
_RUN_MARKERS = ("settings.json", "summary.json", "metrics.jsonl", "model.safetensors", "launch")


def prepare_out_dir(settings: LocalSettings) -> Path:
    """The run's output directory, created and writable: --out, or a new one per run.

    A directory that already holds files is refused unless --resume continues the run in
    it or --overwrite deletes the previous run's outputs first (only if it holds a hetrl
    run: hetrl deletes nothing else), so two runs never mix their metrics. A resume is
    checked against the run's settings.json before anything starts.

    Raises:
        ConfigError: the directory holds files and neither flag says what to do, it
            cannot be created or written, or a resume changes what the run's network
            depends on (launch.config.RESUME_FIXED).
    """
    out = Path(settings.out or default_run_dir(settings.env, settings.seed))
    if settings.resume and settings.overwrite:
        raise ConfigError("--resume continues the run in --out, --overwrite starts it again: "
                          "give one of them")
    if settings.resume:
        saved = saved_settings(out, LocalSettings)
        if saved is not None:
            check_resume(saved, settings, out)
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


def _supervise(settings: LocalSettings, run_dir: Path, events: _Events) -> int:
    env = child_environment(new_token())
    # Children run outside the terminal's process group: a Ctrl-C reaches this launcher
    # alone, which asks the learner to stop (it saves, then stops its workers) instead of
    # every process stopping at once in no order.
    workers = Supervisor(
        lambda i, port, ready: pick(WorkerSettings, settings, worker_id=i, host="127.0.0.1",
                                    port=port, ready_file=ready),
        run_dir, env, say=say, new_session=True)
    learners: list[Child] = []  # rank 0 first (a learner group: --learners > 1)
    evaluator: Child | None = None
    signals: list[int] = []
    stopping = threading.Event()  # from here on a first signal interrupts nothing

    def children() -> list[Child]:  # stopped together: the learner checkpoints meanwhile
        return [*workers.workers, *learners]

    def on_signal(signum, _frame):
        signals.append(signum)
        if len(signals) == 1:
            if stopping.is_set():  # the run is stopping already, in order
                say(f"{_signal_name(signum)}: stopping already (again to quit at once)")
                return
            stopping.set()
            raise _Interrupted(signum)
        # A second one while stopping: wait for nothing more.
        kill_all([*children(), *([evaluator] if evaluator is not None else [])])
        say(f"{_signal_name(signum)} again: stopped at once; the model and checkpoint are "
            "those last written")
        os._exit(EXIT_INTERRUPTED)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    in_main = _is_main_thread()
    if in_main:
        for s in previous:
            signal.signal(s, on_signal)
    try:
        finishing = run_dir / "learner.finishing"
        finishing.unlink(missing_ok=True)
        addresses_file = run_dir / "workers.json"
        addresses_file.unlink(missing_ok=True)
        # The learner starts first and imports while the workers start; it waits for
        # their addresses, which exist once every worker listens.
        stop_reason = run_dir / "stop-reason"
        stop_reason.unlink(missing_ok=True)
        learner_settings = pick(LearnerSettings, settings, addresses_file=str(addresses_file),
                                finishing_file=str(finishing), write_settings=False,
                                stop_reason_file=str(stop_reason),
                                rendezvous=_group_rendezvous(run_dir, settings.learners))
        for rank in range(settings.learners):
            # Rank 0 talks on this terminal; the other ranks log to launch/logs.
            learners.append(spawn(
                "learner" if rank == 0 else f"learner-rank{rank}", "hetrl.learner.learner",
                dataclasses.replace(learner_settings, rank=rank), run_dir,
                _group_environment(env, settings.learners), log_to_file=rank > 0,
                new_session=True))
        addresses = workers.start_and_wait(settings.workers, settings.startup_timeout)
        write_json(addresses_file, {"addresses": addresses})
        if settings.eval_every:
            evaluator = start_evaluator(Path(settings.out), settings.eval_episodes,
                                        settings.seed, run_dir, env, new_session=True,
                                        deterministic=settings.eval_deterministic)
        code = _watch(workers, learners, finishing, settings.shutdown_grace)
        stopping.set()
        if evaluator is not None and code == EXIT_OK:
            finish_evaluations(evaluator, Path(settings.out), settings.shutdown_grace)
        return code
    except _Interrupted as exc:
        say(f"{_signal_name(exc.signum)}: stopping; the learner saves its model and a "
            "checkpoint first (Ctrl-C again to quit at once)")
        _stop_learners_first(learners, exc.signum, settings.shutdown_grace)
        stop_all(children(), settings.shutdown_grace)
        if exc.signum == signal.SIGTERM and all(c.exit_code() == 0 for c in children()):
            # A stop (SageMaker's, a scheduler's) that every child honoured: the learner
            # checkpointed and saved its model, so the stop itself succeeded.
            return EXIT_OK
        return EXIT_INTERRUPTED
    except ChildFailedError as exc:
        stopping.set()
        say(str(exc))
        if not isinstance(exc, _LearnerFailed):  # the learner's summary says its own
            events.failure = str(exc)
        if any(learner.exit_code() is None for learner in learners):
            # The learner's summary names this cause, not "stopped: signal SIGTERM".
            _tell_stop_reason(run_dir, str(exc).strip().splitlines()[0])
        _stop_learners_first(learners, signal.SIGTERM, settings.shutdown_grace)
        stop_all(children(), settings.shutdown_grace)
        return EXIT_FAILED
    finally:
        stopping.set()
        events.worker_restarts = workers.restarts
        stop_all(children(), settings.shutdown_grace)  # no-op when all have exited
        if evaluator is not None:
            stop_all([evaluator], settings.shutdown_grace)
        if in_main:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _seconds(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def _tell_stop_reason(run_dir: Path, reason: str) -> None:
    """Leave the learner the reason it is stopped for (whole, or not at all: on a full
    disk it is stopped all the same, as 'signal SIGTERM')."""
    tmp = run_dir / ".stop-reason.tmp"
    try:
        tmp.write_text(reason)
        tmp.replace(run_dir / "stop-reason")
    except OSError:
        tmp.unlink(missing_ok=True)


def _signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _stop_learners_first(learners: list[Child], signum: int, grace: float) -> None:
    """Pass the stop to every learner rank at once and give them `grace` s: rank 0 saves
    the model and a checkpoint, then each rank stops its workers itself (a Stop on each
    stream)."""
    running = [learner for learner in learners if learner.exit_code() is None]
    for learner in running:
        learner.process.send_signal(signum)
    deadline = time.monotonic() + grace
    for learner in running:
        try:
            learner.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say(f"the {learner.name} did not stop within {grace:.0f} s (--shutdown-grace); "
                "ending it")


def say(message: str) -> None:
    """A launcher message on stderr, on a line of its own even while the learner's
    progress bar is drawn on the same terminal."""
    prefix = "\r\x1b[K" if sys.stderr.isatty() else ""
    print(f"{prefix}hetrl: {message}", file=sys.stderr, flush=True)


def _watch(workers: Supervisor, learners: list[Child], finishing: Path, grace: float) -> int:
    """Wait for the learner (every rank of a group) while `workers` restarts those that
    crash; on its success, let the workers finish (launch.supervisor) and return EXIT_OK.

    Once the learner has begun to stop (it creates `finishing` first) or has exited,
    nothing is restarted: a worker born then would wait for a learner that never comes.

    Raises:
        ChildFailedError: a learner rank failed, or a worker did (Supervisor.poll).
    """

    def training() -> bool:
        return not finishing.exists() and all(c.exit_code() is None for c in learners)

    while True:
        codes = [learner.exit_code() for learner in learners]
        failed = _first_cause(learners, codes)
        if failed is not None or all(code is not None for code in codes):
            break
        workers.poll(may_restart=training)
        time.sleep(0.1)
    if failed is not None:
        child, code = failed
        group = len(learners) > 1
        name = f"learner rank {learners.index(child)} ({child.name})" if group else "the learner"
        assert code is not None
        if code < 0:
            raise _LearnerFailed(f"{name} was killed by {signal.Signals(-code).name} "
                                 "(out of memory, or someone's kill?); " + (
                                     "the other ranks checkpoint the last whole update"
                                     if group else "its last checkpoint stands"))
        raise _LearnerFailed(f"{name} exited with code {code}; its error is the last "
                             "ERROR line above" + (f" (or in launch/logs/{child.name}.log)"
                                                   if group else ""))
    workers.finish(grace)
    return EXIT_OK


def _first_cause(learners: list[Child], codes: list[int | None]
                 ) -> tuple[Child, int] | None:
    """The failed learner rank to blame: one killed by a signal before one that exited
    with an error, since the others of a group exit with an error because it died."""
    failed = [(child, code) for child, code in zip(learners, codes, strict=True)
              if code is not None and code != EXIT_OK]
    return min(failed, key=lambda failure: failure[1] >= 0, default=None)


def _group_rendezvous(run_dir: Path, learners: int) -> str:
    """Where a local learner group meets: a file in the run's launch folder (a file
    store: no port to open; a stale one from an earlier run would mislead it)."""
    if learners == 1:
        return ""
    store = run_dir / "learner-group.store"
    store.unlink(missing_ok=True)
    return f"file://{store.resolve()}"


def _group_environment(env: dict[str, str], learners: int) -> dict[str, str]:
    """A local group's ranks connect over the loopback interface only (gloo otherwise
    listens on the interface of the host's name, which may face a network)."""
    if learners == 1 or "GLOO_SOCKET_IFNAME" in env:
        return env
    return dict(env, GLOO_SOCKET_IFNAME="lo")


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
