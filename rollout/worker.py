"""The rollout worker process: a gRPC server that streams fragments to one learner.

Lifecycle: IDLE (listening, envs reset) -> STREAMING (a learner holds the one stream)
-> IDLE again if the stream ends, or STOPPED when the learner sends Stop, a signal
arrives, or no learner has been seen for `learner_timeout` seconds (the dead-man's
switch, so a worker never outlives its learner). A worker samples only with weights
from the learner and only while it holds a credit, so it is never more than its
credits ahead. A fragment being sent when a stream breaks is lost and counted.

Faults: a failing env is recreated by its EnvGuard and its episode aborted (see
collector); an env that keeps failing ends the worker with EXIT_UNHEALTHY and the env's
traceback in the log; an env call that runs past `step_timeout` trips the watchdog,
which exits with EXIT_HUNG so the supervisor restarts the worker. Malformed or
non-finite weights from the learner are refused (INVALID_ARGUMENT / dropped) and
counted; the worker stays up. A gRPC health service reports SERVING until it stops.
"""

from __future__ import annotations

import dataclasses
import enum
import faulthandler
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import torch
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from hetrl.protos import hetrl_pb2, hetrl_pb2_grpc
from hetrl.rollout import fragments, wire
from hetrl.rollout.collector import Collector
from hetrl.rollout.envs import make_vector_env
from hetrl.rollout.errors import (
    ConfigError,
    EnvUnhealthyError,
    HetrlError,
    NonFiniteError,
    WireFormatError,
)
from hetrl.rollout.exits import EXIT_FAILED, EXIT_HUNG, EXIT_NO_LEARNER, EXIT_OK, EXIT_UNHEALTHY
from hetrl.rollout.lifetime import start_child
from hetrl.rollout.policy import Policy, load_policy_arrays, policy_arrays
from hetrl.rollout.rewards import RewardNormalizer
from hetrl.rollout.settings import WorkerSettings, from_json
from hetrl.rollout.transport import (
    MAX_MESSAGE_BYTES,
    create_server,
    token_from_env,
    transport_options,
)

log = logging.getLogger("hetrl.worker")

SERVICE_NAME = "hetrl.Rollout"


class WorkerState(enum.Enum):
    IDLE = "idle"
    STREAMING = "streaming"
    STOPPED = "stopped"


def worker_seed(seed: int, worker_id: int) -> int:
    """Distinct, reproducible seeds per worker (envs and sampling)."""
    return seed * 10_007 + worker_id * 101


class _Inbox:
    """What the learner has sent on the current stream: credits, newest weights, stop."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.credits = 0
        self.weights: hetrl_pb2.Weights | None = None
        self.stop_reason: str | None = None
        self.malformed: str | None = None  # a request that did not parse
        self.closed = False

    def wait_ready(self, have_weights: bool, timeout: float) -> bool:
        """Wait until a credit (and weights, the first time) or stop/close; False on timeout."""
        with self.cond:
            return self.cond.wait_for(
                lambda: self.closed
                or self.malformed is not None
                or self.stop_reason is not None
                or (self.credits > 0 and (have_weights or self.weights is not None)),
                timeout,
            )


class RolloutWorker(hetrl_pb2_grpc.RolloutServicer):
    """Owns the vector env, the CPU policy and the collector; serves one stream at a time."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        torch.set_num_threads(settings.worker_torch_threads)
        seed = worker_seed(settings.seed, settings.worker_id)
        torch.manual_seed(seed)
        self.envs = self._make_envs()
        obs_space = self.envs.single_observation_space
        act_space = self.envs.single_action_space
        self.policy = Policy(obs_space, act_space, settings)
        self.policy.eval()
        _check_fragment_size(settings, obs_space, act_space)
        self.collector = Collector(
            self.envs, self.policy, settings.fragment_length, seed, remake=self._make_envs,
            failure_rate=settings.env_failure_rate,
            failure_window=settings.env_failure_window, nonfinite=settings.nonfinite,
        )
        self.normalize_rewards = (
            RewardNormalizer(self.envs.num_envs, settings.reward_norm_gamma, settings.reward_clip)
            if settings.normalize_rewards else None)
        self.hello = hetrl_pb2.Hello(
            worker_id=settings.worker_id,
            incarnation=uuid.uuid4().hex,
            num_envs=self.envs.num_envs,
            fragment_length=settings.fragment_length,
            env=settings.env,
            observation_space=str(obs_space),
            action_space=str(act_space),
        )
        self.state = WorkerState.IDLE
        self.stop_reason = ""
        self.failure: str | None = None
        self.unhealthy = False
        self.messages_malformed = 0
        self.weights_nonfinite = 0
        self.health = health.HealthServicer()
        self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self.stopped = threading.Event()
        self.version = -1
        self.sequence = 0
        self.fragments_sent = 0
        self.fragments_lost = 0
        self.last_learner_seen = time.monotonic()
        self._stream_lock = threading.Lock()

    def _make_envs(self):
        s = self.settings
        return make_vector_env(s, s.envs_per_worker, s.vector_mode)

    def _set_health(self, status) -> None:
        for service in ("", SERVICE_NAME):
            self.health.set(service, status)

    # -- gRPC ------------------------------------------------------------------
    def Stream(self, request_iterator, context) -> Iterator[bytes]:
        if self.stopped.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "worker is stopping")
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
        inbox = _Inbox()
        reader = threading.Thread(
            target=_read_requests, args=(requests, inbox), name="learner-reader", daemon=True
        )
        reader.start()
        yield hetrl_pb2.WorkerMessage(hello=self.hello).SerializeToString()
        while True:
            wait_start = time.perf_counter()
            while not inbox.wait_ready(self.version >= 0, timeout=1.0):
                if not context.is_active() or self.stopped.is_set():
                    return
            waited = time.perf_counter() - wait_start
            with inbox.cond:
                malformed = inbox.malformed
                if malformed is None and inbox.stop_reason is not None:
                    self._stop(f"learner: {inbox.stop_reason}")
                    return
                if malformed is None and inbox.closed:
                    return
                inbox.credits -= 1
            if malformed is not None:
                self.messages_malformed += 1
                log.error("a request from the learner does not parse; stream refused: %s",
                          malformed)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"malformed LearnerMessage: {malformed}"[:2000])
            with inbox.cond:
                weights, inbox.weights = inbox.weights, None
            if weights is not None and not self._load_weights(weights, context):
                if self.version < 0:  # nothing usable to sample with yet: wait for more
                    with inbox.cond:
                        inbox.credits += 1
                    continue
            try:
                arrays = self.collector.collect()
                if self.normalize_rewards is not None:  # the episode returns stay raw
                    arrays.rewards = self.normalize_rewards(
                        arrays.rewards, arrays.terminated, arrays.truncated, arrays.valid)
            except (EnvUnhealthyError, NonFiniteError) as exc:
                log.error("%s", exc)  # the env's traceback, for the user and the supervisor
                self.unhealthy = True
                self.failure = f"{type(exc).__name__}: {exc}"
                self._stop("unhealthy env")
                context.abort(grpc.StatusCode.INTERNAL, f"worker unhealthy: {exc}"[:2000])
            except Exception as exc:  # the policy (or an unguarded env) broke: done
                log.exception("stepping the envs failed")
                self.failure = f"{type(exc).__name__}: {exc}"
                self._stop(f"error: {self.failure}")
                context.abort(grpc.StatusCode.INTERNAL, f"worker failed: {self.failure}")
            message = fragments.serialize(
                arrays, self.settings.worker_id, self.hello.incarnation,
                self.sequence, self.version, waited,
            )
            self.sequence += 1
            if not context.is_active():
                self.fragments_lost += 1
                log.warning("stream closed before fragment %d was sent; lost", self.sequence - 1)
                return
            yield message
            self.fragments_sent += 1

    def _load_weights(self, weights: hetrl_pb2.Weights, context) -> bool:
        """Load weights into the policy; False if they were dropped (non-finite).
        Malformed weights end the stream with INVALID_ARGUMENT; the worker stays up."""
        try:
            arrays = wire.decode_named(weights.arrays)
            bad = [name for name, a in arrays.items()
                   if a.dtype.kind in "fc" and not np.isfinite(a).all()]
            if bad:
                self.weights_nonfinite += 1
                if self.settings.nonfinite == "fail":
                    raise NonFiniteError(f"weights {bad} hold NaN/Inf (--nonfinite fail)")
                log.error("weights version %d hold NaN/Inf in %s; dropped, keeping version %d",
                          weights.version, bad, self.version)
                return False
            load_policy_arrays(self.policy, arrays)
        except (WireFormatError, KeyError, ValueError, RuntimeError) as exc:
            if isinstance(exc, NonFiniteError):
                self.failure = str(exc)
                self._stop(f"error: {exc}")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            self.messages_malformed += 1
            log.error("malformed weights from the learner refused: %s", exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed weights: {exc}"[:2000])
        self.version = weights.version
        return True

    # -- lifecycle ---------------------------------------------------------------
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
        self.envs.close()


def _read_requests(requests, inbox: _Inbox) -> None:
    """Parse and drain the learner's messages into the inbox until the stream ends.

    Requests arrive as bytes (see add_to_server) so that one that does not parse is
    answered INVALID_ARGUMENT by the serving loop, not INTERNAL by gRPC."""
    try:
        for raw in requests:
            try:
                message = hetrl_pb2.LearnerMessage.FromString(raw)
            except DecodeError as exc:
                with inbox.cond:
                    inbox.malformed = str(exc) or "undecodable bytes"
                    inbox.cond.notify_all()
                return
            kind = message.WhichOneof("kind")
            with inbox.cond:
                if kind == "weights":
                    inbox.weights = message.weights
                elif kind == "credits":
                    inbox.credits += message.credits.count
                elif kind == "stop":
                    inbox.stop_reason = message.stop.reason or "stop"
                inbox.cond.notify_all()
    except grpc.RpcError:
        pass  # the stream ended; the serving loop sees `closed`
    finally:
        with inbox.cond:
            inbox.closed = True
            inbox.cond.notify_all()


def receive_limit(policy: Policy) -> int:
    """The largest LearnerMessage this worker accepts: one set of its policy's weights
    (their bytes plus per-array names, dtypes and shapes), with room to spare. Anything
    bigger is refused by gRPC (RESOURCE_EXHAUSTED) before it is buffered whole."""
    arrays = policy_arrays(policy)
    payload = sum(a.nbytes for a in arrays.values())
    return int(payload * 1.25) + 1024 * len(arrays) + (64 << 10)


def _check_fragment_size(settings: WorkerSettings, obs_space, act_space) -> None:
    """Refuse a configuration whose fragment cannot fit in one message."""
    t_len, n = settings.fragment_length, settings.envs_per_worker
    obs_bytes = (t_len + 1) * n * obs_space.dtype.itemsize * math.prod(obs_space.shape)
    # actions (int64 or float32 each), reward, logprob (f4), three bool flags
    step_bytes = t_len * n * (8 * math.prod(act_space.shape or ()) + 4 + 4 + 3)
    size = obs_bytes + step_bytes
    if size > MAX_MESSAGE_BYTES * 0.9:
        raise ConfigError(
            f"a fragment of {t_len} steps x {n} envs is about {size >> 20} MiB, over the "
            f"{MAX_MESSAGE_BYTES >> 20} MiB message limit: lower --fragment-length "
            "or --envs-per-worker"
        )


def _watchdog(worker: RolloutWorker, step_timeout: float) -> None:
    """Exit with EXIT_HUNG when one env call runs longer than step_timeout. A hung env
    cannot be interrupted from Python; only a fresh process recovers, so the worker
    dumps every thread's stack to its log and leaves the restart to its supervisor."""
    while not worker.stopped.wait(min(1.0, step_timeout / 4)):
        since = worker.collector.busy_since
        if since is not None and time.monotonic() - since > step_timeout:
            log.error("an env step has not returned for %.1f s (--step-timeout %.1f): the env "
                      "is hung; exiting with code %d so the supervisor restarts this worker",
                      time.monotonic() - since, step_timeout, EXIT_HUNG)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
            os._exit(EXIT_HUNG)


def add_to_server(worker: RolloutWorker, server: grpc.Server) -> None:
    """Serve `worker` as hetrl.Rollout. Unlike the generated registration, responses go
    out as the bytes the worker serialized itself (fragments.serialize), not re-encoded,
    and requests come in as bytes that the worker parses itself."""
    handler = grpc.stream_stream_rpc_method_handler(
        worker.Stream,
        request_deserializer=None,  # parsed by _read_requests, which refuses bad bytes
        response_serializer=None,  # the handler yields serialized WorkerMessages
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("hetrl.Rollout", {"Stream": handler}),)
    )


def _write_ready_file(path: str, address: str) -> None:
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(json.dumps({"address": address, "pid": os.getpid()}))
    tmp.replace(target)


def run_worker(settings: WorkerSettings) -> int:
    """Serve until stopped; return the process exit code."""
    token = token_from_env()
    worker = RolloutWorker(settings)
    options = dataclasses.replace(transport_options(settings),
                                  max_receive_bytes=receive_limit(worker.policy))
    server, port = create_server(f"{settings.host}:{settings.port}", token, options=options)
    add_to_server(worker, server)
    health_pb2_grpc.add_HealthServicer_to_server(worker.health, server)
    server.start()
    address = f"{settings.host}:{port}"
    log.info("worker %d serving %s on %s", settings.worker_id, settings.env, address)
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
    if worker.failure is not None:
        code = EXIT_UNHEALTHY if worker.unhealthy else EXIT_FAILED
    log.info(
        "worker %d stopped (%s): %d fragments sent, %d lost, %d env faults, %d episodes "
        "aborted, %d malformed and %d non-finite weights refused",
        settings.worker_id, worker.stop_reason or "no learner", worker.fragments_sent,
        worker.fragments_lost, worker.collector.total_faults, worker.collector.total_aborted,
        worker.messages_malformed, worker.weights_nonfinite,
    )
    return code


def main(argv: list[str] | None = None) -> int:
    """`python -m hetrl.rollout.worker SETTINGS_JSON`: the launcher's way to start a worker."""
    settings_file = start_child(argv)
    try:
        return run_worker(from_json(WorkerSettings, settings_file.read_text()))
    except (EnvUnhealthyError, NonFiniteError) as exc:  # already failing at the first reset
        log.error("%s", exc)
        return EXIT_UNHEALTHY
    except HetrlError as exc:
        log.error("%s", exc)
        return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
