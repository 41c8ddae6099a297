"""The rollout worker process (worker inference): a gRPC server that streams fragments
to one learner.

Its lifecycle (one stream at a time, stop, the dead-man's switch, health) is
rollout/serving.py's; the env-host side of central inference is rollout/env_server.py.
A worker samples only with weights
from the learner and only while it holds a credit, so it is never more than its
credits ahead. A fragment being sent when a stream breaks is lost and counted.

Faults: a failing env is recreated by its EnvGuard and its episode aborted (see
collector); an env that keeps failing ends the worker with EXIT_UNHEALTHY and the env's
traceback in the log; an env call that runs past `step_timeout` trips the watchdog,
which exits with EXIT_HUNG so the supervisor restarts the worker. Malformed or
non-finite weights from the learner are refused (INVALID_ARGUMENT / dropped) and
counted; the worker stays up.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator

import grpc
import numpy as np
import torch

from hetrl.protos import hetrl_pb2
from hetrl.rollout import fragments, wire
from hetrl.rollout.collector import Collector
from hetrl.rollout.envs import describe_env, make_vector_env
from hetrl.rollout.errors import ConfigError, NonFiniteError, WireFormatError
from hetrl.rollout.lifetime import exit_now
from hetrl.rollout.observations import ObsLayout
from hetrl.rollout.policy import Policy, load_policy_arrays, policy_arrays
from hetrl.rollout.rewards import RewardNormalizer, training_rewards
from hetrl.rollout.serving import (  # noqa: F401 (SERVICE_NAME, WorkerState: re-exported)
    SERVICE_NAME,
    StreamServer,
    WorkerState,
    add_to_server,
    exit_code_of,
    read_requests,
    run_main,
    serve_until_stopped,
    worker_seed,
)
from hetrl.rollout.settings import WorkerSettings
from hetrl.rollout.transport import MAX_MESSAGE_BYTES

log = logging.getLogger("hetrl.worker")


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


class RolloutWorker(StreamServer):
    """Owns the vector env, the CPU policy and the collector; serves one stream at a time."""

    def __init__(self, settings: WorkerSettings, prepare: bool = True) -> None:
        """Build the worker; its envs are made and reset now, or, with `prepare=False`,
        by `prepare` once its server listens (serve_until_stopped)."""
        super().__init__(settings)
        torch.set_num_threads(settings.worker_torch_threads)
        self.seed = worker_seed(settings.seed, settings.worker_id)
        torch.manual_seed(self.seed)
        spaces = describe_env(settings)
        obs_space, act_space = spaces.observation_space, spaces.action_space
        self.policy = Policy(obs_space, act_space, settings)
        self.policy.eval()
        _check_fragment_size(settings, obs_space, act_space)
        self.normalize_rewards = (
            RewardNormalizer(settings.envs_per_worker, settings.reward_norm_gamma,
                             settings.reward_clip)
            if settings.normalize_rewards else None)
        self.hello = hetrl_pb2.Hello(
            worker_id=settings.worker_id,
            incarnation=uuid.uuid4().hex,
            num_envs=settings.envs_per_worker,
            fragment_length=settings.fragment_length,
            env=settings.env,
            observation_space=str(obs_space),
            action_space=str(act_space),
            inference="worker",
        )
        self._progress: collections.Counter[str] = collections.Counter()
        if prepare:
            self.prepare()
            self.ready.set()
        self.weights_nonfinite = 0
        self.version = -1
        self.sequence = 0
        self.fragments_sent = 0
        self.fragments_lost = 0

    def prepare(self) -> None:
        """Make the envs and reset them (the collector's first observations), saying
        how far it has come: a simulator that takes 20 s a reset is starting, not hung."""
        s = self.settings
        self.starting_progress(f"making envs, 0 of {s.envs_per_worker} done")
        self.envs = self._make_envs()
        self.starting_progress(f"resetting envs, 0 of {s.envs_per_worker} done")
        self.collector = Collector(
            self.envs, self.policy, s.fragment_length, self.seed, remake=self._make_envs,
            failure_rate=s.env_failure_rate, failure_window=s.env_failure_window,
            nonfinite=s.nonfinite, episodic_life=s.episodic_life,
        )

    def _env_progress(self, event: str) -> None:
        """An env was made or finished a reset (EnvGuard's hook, synchronous vector envs
        only): start-up moves on, and a step that autoresets is slow, not hung."""
        self._progress[event] += 1
        if not self.ready.is_set():
            doing = "making" if event == "made" else "resetting"
            self.starting_progress(f"{doing} envs, {self._progress[event]} of "
                                   f"{self.settings.envs_per_worker} done")
        else:
            self.starting_progress(self.starting)

    def _make_envs(self):
        s = self.settings
        return make_vector_env(s, s.envs_per_worker, s.vector_mode,
                               on_progress=self._env_progress)

    def busy_since(self) -> float | None:
        return self.collector.busy_since

    # -- gRPC ------------------------------------------------------------------
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
            arrays = self.guarded(context, lambda: self._collect(inbox))
            if arrays is None:  # a Stop came mid-fragment: it is not finished, nor sent
                self.fragments_lost += 1
                self._stop(f"learner: {inbox.stop_reason}")
                return
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
            self.delivered(self.fragments_sent)

    def _collect(self, inbox: _Inbox) -> fragments.FragmentArrays | None:
        """One fragment, its rewards clipped and normalised for training as asked (episode
        returns stay raw);
        None when the learner's Stop arrives before it is complete."""
        arrays = self.collector.collect_unless(lambda: inbox.stop_reason is not None)
        if arrays is None:
            return None
        arrays.rewards = training_rewards(arrays.rewards, arrays.terminated, arrays.truncated,
                                          arrays.valid, self.settings.clip_rewards,
                                          self.normalize_rewards)
        return arrays

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

    def close(self) -> None:
        if hasattr(self, "collector"):  # the vector env now stepped (maybe recreated)
            self.collector.envs.close()
        elif hasattr(self, "envs"):  # stopped during start-up: what was made so far
            self.envs.close()


def _read_requests(requests, inbox: _Inbox) -> None:
    """Drain the learner's messages into the inbox until the stream ends."""

    def take(message: hetrl_pb2.LearnerMessage) -> str | None:
        kind = message.WhichOneof("kind")
        if kind == "weights":
            inbox.weights = message.weights
        elif kind == "credits":
            inbox.credits += message.credits.count
        elif kind == "stop":
            inbox.stop_reason = message.stop.reason or "stop"
        return None

    read_requests(requests, inbox, take)


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
    obs_bytes = (t_len + 1) * n * ObsLayout.of(obs_space).nbytes
    # actions (int64 or float32 each), reward, logprob (f4), three bool flags
    step_bytes = t_len * n * (8 * math.prod(act_space.shape or ()) + 4 + 4 + 3)
    # a recurrent policy's episode starts and state before step 0
    state_bytes = (t_len + 1 + 4 * 2 * settings.rnn_size) * n if settings.recurrent != "none" \
        else 0
    size = obs_bytes + step_bytes + state_bytes
    if size > MAX_MESSAGE_BYTES * 0.9:
        raise ConfigError(
            f"a fragment of {t_len} steps x {n} envs is about {size >> 20} MiB, over the "
            f"{MAX_MESSAGE_BYTES >> 20} MiB message limit: lower --fragment-length "
            "or --envs-per-worker"
        )


def run_worker(settings: WorkerSettings) -> int:
    """Serve until stopped; return the process exit code."""
    worker = RolloutWorker(settings, prepare=False)  # its envs once it listens
    code = serve_until_stopped(worker, receive_limit(worker.policy))
    code = exit_code_of(worker, code)
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
    return run_main(argv, run_worker)


if __name__ == "__main__":
    exit_now(main())
