"""What every worker process shares, whichever side runs the policy: the one-stream
lifecycle, the gRPC registration, the hung-env watchdog and the serve-until-stopped loop.

Lifecycle: IDLE (listening, envs reset) -> STREAMING (a learner holds the one stream)
-> IDLE again if the stream ends, or STOPPED when the learner sends Stop, a signal
arrives, or no learner has been seen for `learner_timeout` seconds (the dead-man's
switch, so a worker never outlives its learner). A second learner is refused with
ALREADY_EXISTS. A gRPC health service reports SERVING until the worker stops.
`StreamServer` keeps that lifecycle; a subclass says what one stream carries
(`_serve`): fragments (rollout/worker.py, worker inference) or env steps
(rollout/env_server.py, central inference). No torch here: an env host in central
mode imports none.
"""

from __future__ import annotations

import dataclasses
import enum
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from hetrl.protos import hetrl_pb2
from hetrl.rollout.errors import EnvShapeError, EnvUnhealthyError, HetrlError, NonFiniteError
from hetrl.rollout.exits import (
    EXIT_ENV_BROKEN,
    EXIT_FAILED,
    EXIT_HUNG,
    EXIT_NO_LEARNER,
    EXIT_OK,
    EXIT_UNHEALTHY,
)
from hetrl.rollout.lifetime import start_child
from hetrl.rollout.settings import WorkerSettings, from_json
from hetrl.rollout.transport import create_server, token_from_env, transport_options

log = logging.getLogger("hetrl.worker")

SERVICE_NAME = "hetrl.Rollout"
STARTING = "starting: "
"""How a worker's UNAVAILABLE answer begins while it starts (the learner keeps waiting)."""
PROGRESS_EVERY = 10.0
"""Seconds between writes of a worker's progress file after the first."""


class StartupCancelled(HetrlError):
    """A stop arrived while the worker was still making or resetting its envs."""


class WorkerState(enum.Enum):
    IDLE = "idle"
    STREAMING = "streaming"
    STOPPED = "stopped"


def worker_seed(seed: int, worker_id: int) -> int:
    """Distinct, reproducible seeds per worker (envs and sampling)."""
    return seed * 10_007 + worker_id * 101


class StreamServer:
    """One learner stream at a time, stop and health; subclasses implement `_serve`."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.state = WorkerState.IDLE
        self.stop_reason = ""
        self.failure: str | None = None
        self.unhealthy = False
        self.env_broken = False  # a bug in the env (EnvShapeError), not a failure rate
        self.messages_malformed = 0
        self.health = health.HealthServicer()
        self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self.stopped = threading.Event()
        self.last_learner_seen = time.monotonic()
        self._stream_lock = threading.Lock()
        self._progress_written = -PROGRESS_EVERY
        # Start-up (making and resetting envs, which takes minutes for some simulators)
        # runs after the server listens: until `ready`, a learner is told what it is
        # doing, and the watchdog's clock restarts at each step of it.
        self.ready = threading.Event()
        self.starting = "starting"
        self._started = self._progress_at = time.monotonic()

    def prepare(self) -> None:
        """Start-up that may be slow (envs made and reset), after the server listens;
        subclasses that have any call `starting_progress` as it goes."""

    def starting_progress(self, what: str) -> None:
        """Start-up goes on: `what` it is doing now (told to a learner that asks).

        Raises:
            StartupCancelled: the worker was asked to stop meanwhile (a signal): the
                start-up ends here instead of making and resetting every env first.
        """
        self.starting = what
        self._progress_at = time.monotonic()
        if self.stopped.is_set() and not self.ready.is_set():
            raise StartupCancelled(self.stop_reason)

    def watched_since(self) -> float | None:
        """What the watchdog times: the last progress of start-up, then each env call
        (restarted when a slow env finishes a reset within a step: progress too)."""
        if not self.ready.is_set():
            return self._progress_at
        busy = self.busy_since()
        return None if busy is None else max(busy, self._progress_at)

    def delivered(self, count: int) -> None:
        """`count` fragments (or env steps) have reached the learner so far: say so in the
        progress file, at the first and then every PROGRESS_EVERY seconds."""
        if not self.settings.progress_file:
            return
        now = time.monotonic()
        if now - self._progress_written < PROGRESS_EVERY:
            return
        self._progress_written = now
        target = Path(self.settings.progress_file)
        tmp = target.with_suffix(target.suffix + ".tmp")
        try:
            tmp.write_text(json.dumps({"delivered": count, "pid": os.getpid()}))
            tmp.replace(target)
        except OSError as exc:  # a supervisor's aid, not the worker's job
            log.debug("cannot write %s: %s", target, exc)

    def _set_health(self, status) -> None:
        for service in ("", SERVICE_NAME):
            self.health.set(service, status)

    def Stream(self, request_iterator, context) -> Iterator[bytes]:
        if self.stopped.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "worker is stopping")
        if not self.ready.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"{STARTING}{self.starting}, {time.monotonic() - self._started:.0f} s "
                          "since it started")
        if not self._stream_lock.acquire(blocking=False):
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "a learner is already connected")
        self.state = WorkerState.STREAMING
        log.info("learner connected from %s", context.peer())
        try:
            yield from self._serve(request_iterator, context)
        finally:
            if not self.stopped.is_set():
                log.warning("the learner's stream ended without a Stop (the learner is gone, "
                            "restarting or reconnecting); waiting up to %.0f s "
                            "(--learner-timeout) for a learner", self.settings.learner_timeout)
            self.last_learner_seen = time.monotonic()
            if not self.stopped.is_set():
                self.state = WorkerState.IDLE
            self._stream_lock.release()

    def _serve(self, requests, context) -> Iterator[bytes]:
        """The serialized WorkerMessages of one stream, until it ends or the worker stops."""
        raise NotImplementedError

    def busy_since(self) -> float | None:
        """Monotonic start of the env call running now (None between calls)."""
        raise NotImplementedError

    def guarded(self, context, call):
        """Run an env call; an env that keeps failing, or a bug, ends the worker."""
        try:
            return call()
        except (EnvUnhealthyError, NonFiniteError) as exc:
            log.error("%s", exc)  # the env's traceback, for the user and the supervisor
            self.unhealthy = True
            self.env_broken = isinstance(exc, EnvShapeError)
            self.failure = f"{type(exc).__name__}: {exc}"
            self._stop("unhealthy env")
            context.abort(grpc.StatusCode.INTERNAL, f"worker unhealthy: {exc}"[:2000])
        except Exception as exc:
            log.exception("stepping the envs failed")
            self.failure = f"{type(exc).__name__}: {exc}"
            self._stop(f"error: {self.failure}")
            context.abort(grpc.StatusCode.INTERNAL, f"worker failed: {self.failure}")

    def _stop(self, reason: str) -> None:
        if not self.stopped.is_set():
            self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            self.stop_reason = reason
            self.state = WorkerState.STOPPED
            self.stopped.set()

    def request_stop(self, reason: str) -> None:
        """Ask the worker to stop (thread- and signal-safe)."""
        self._stop(reason)

    def learner_gone_for(self) -> float:
        """Seconds since a learner last held the stream (0 while one does)."""
        if self.state is WorkerState.STREAMING:
            return 0.0
        return time.monotonic() - self.last_learner_seen

    def close(self) -> None:
        """Release the envs (after the server has stopped)."""


class Inbox(Protocol):
    """What a stream's request reader fills: under `cond`, `malformed` and `closed`."""

    cond: threading.Condition
    malformed: str | None
    closed: bool


def read_requests(requests, inbox: Inbox,
                  take: Callable[[hetrl_pb2.LearnerMessage], str | None]) -> None:
    """Parse the learner's messages until the stream ends, handing each to `take` (called
    with `inbox.cond` held; it returns what is wrong with the message, or None). Bytes
    that do not parse, or a message `take` refuses, set `inbox.malformed` and end the
    reading; the serving loop answers INVALID_ARGUMENT. Requests arrive as bytes (see
    add_to_server), so this is where they are parsed."""
    try:
        for raw in requests:
            try:
                message = hetrl_pb2.LearnerMessage.FromString(raw)
            except DecodeError as exc:
                problem: str | None = str(exc) or "undecodable bytes"
            else:
                problem = None
            with inbox.cond:
                if problem is None:
                    problem = take(message)
                if problem is not None:
                    inbox.malformed = problem
                inbox.cond.notify_all()
            if problem is not None:
                return
    except grpc.RpcError:
        pass  # the stream ended; the serving loop sees `closed`
    finally:
        with inbox.cond:
            inbox.closed = True
            inbox.cond.notify_all()


def add_to_server(worker: StreamServer, server: grpc.Server) -> None:
    """Serve `worker` as hetrl.Rollout. Unlike the generated registration, responses go
    out as the bytes the worker serialized itself (fragments.serialize), not re-encoded,
    and requests come in as bytes that the worker parses itself (so a request that does
    not parse is answered INVALID_ARGUMENT by the worker, not INTERNAL by gRPC)."""
    handler = grpc.stream_stream_rpc_method_handler(
        worker.Stream,
        request_deserializer=None,
        response_serializer=None,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("hetrl.Rollout", {"Stream": handler}),)
    )


def _watchdog(worker: StreamServer, step_timeout: float) -> None:
    """Exit with EXIT_HUNG when one env call runs longer than step_timeout. A hung env
    cannot be interrupted from Python; only a fresh process recovers, so the worker
    dumps every thread's stack to its log and leaves the restart to its supervisor."""
    while not worker.stopped.wait(min(1.0, step_timeout / 4)):
        since = worker.watched_since()
        if since is not None and time.monotonic() - since > step_timeout:
            what = ("an env step" if worker.ready.is_set()
                    else f"start-up ({worker.starting})")
            log.error("%s has not moved on for %.1f s (--step-timeout %.1f): the env is "
                      "hung; exiting with code %d so the supervisor restarts this worker",
                      what, time.monotonic() - since, step_timeout, EXIT_HUNG)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
            os._exit(EXIT_HUNG)


def _write_ready_file(path: str, address: str) -> None:
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(json.dumps({"address": address, "pid": os.getpid()}))
    tmp.replace(target)


def serve_until_stopped(worker: StreamServer, max_receive_bytes: int) -> int:
    """Bind, serve `worker` and its health service, stop on a signal, a Stop or the
    dead-man's switch; return EXIT_OK or EXIT_NO_LEARNER (the caller adds failures)."""
    settings = worker.settings
    token = token_from_env()
    options = dataclasses.replace(transport_options(settings),
                                  max_receive_bytes=max_receive_bytes)
    server, port = create_server(f"{settings.host}:{settings.port}", token, options=options)
    add_to_server(worker, server)
    health_pb2_grpc.add_HealthServicer_to_server(worker.health, server)
    server.start()
    address = f"{settings.host}:{port}"
    log.info("worker %d serving %s on %s (inference %s)", settings.worker_id, settings.env,
             address, settings.inference)
    if settings.ready_file:
        _write_ready_file(settings.ready_file, address)

    def on_signal(signum, _frame):
        worker.request_stop(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=_watchdog, args=(worker, settings.step_timeout),
                     name="step-watchdog", daemon=True).start()
    code = EXIT_OK
    try:
        if not worker.ready.is_set():
            try:
                worker.prepare()  # the learner is told "starting: ..." meanwhile
            except StartupCancelled:
                log.info("worker %d stopped during its start-up (%s)", settings.worker_id,
                         worker.stop_reason)
                return code
            worker.ready.set()
            worker.last_learner_seen = time.monotonic()  # the dead-man's switch starts now
            log.info("worker %d ready after %.1f s", settings.worker_id,
                     time.monotonic() - worker._started)
        while not worker.stopped.wait(0.5):
            gone = worker.learner_gone_for()
            if gone > settings.learner_timeout:
                log.error(
                    "no learner for %.0f s (--learner-timeout %.0f); exiting so the job stops",
                    gone, settings.learner_timeout,
                )
                code = EXIT_NO_LEARNER
                break
    finally:
        server.stop(grace=2.0).wait(5.0)
        worker.close()
    return code


def exit_code_of(server: StreamServer, code: int) -> int:
    """A worker's exit code once it has stopped serving: its failure's, if it failed."""
    if server.failure is None:
        return code
    if server.env_broken:
        return EXIT_ENV_BROKEN
    return EXIT_UNHEALTHY if server.unhealthy else EXIT_FAILED


def run_main(argv: list[str] | None, run: Callable[[WorkerSettings], int]) -> int:
    """A worker process's main: settings from the launcher's file, `run` them, and turn
    a hetrl error into its exit code with the reason in the log."""
    settings_file = start_child(argv)
    try:
        return run(from_json(WorkerSettings, settings_file.read_text()))
    except EnvShapeError as exc:  # the env's own contract broken at the first reset
        log.error("%s", exc)
        return EXIT_ENV_BROKEN
    except (EnvUnhealthyError, NonFiniteError) as exc:  # already failing at the first reset
        log.error("%s", exc)
        return EXIT_UNHEALTHY
    except HetrlError as exc:
        log.error("%s", exc)
        return EXIT_FAILED
