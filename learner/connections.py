"""One client stream per rollout worker, all fanned into one bounded queue.

A `WorkerStream` owns a thread ("stream-<address>") that connects (retrying while the
worker is not up yet, for `connect_timeout`), checks the worker's Hello against the
learner's env, sends the newest weights and the initial credits, then decodes every
fragment and puts it on the shared queue. Outgoing messages are coalesced (newest
weights only, credits summed), so nothing the learner sends can pile up. The queue has
an explicit bound (`fan_in_bound`) that credits keep it under; a full queue blocks the
stream thread, which gRPC flow control turns into back-pressure on the worker.

Never trained on, always counted: malformed fragments (their credit is returned), a
fragment whose incarnation or worker id differs from its stream's Hello (no fragment
mixes incarnations), a sequence number already seen for an incarnation (none is trained
twice), and fragments holding NaN/Inf (dropped, or the stream fails under
--nonfinite fail). A new stream (reconnect, restarted worker) always starts with the
newest weights and fresh credits, before the worker samples anything.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import queue
import threading
import time
from typing import Protocol

import grpc
import numpy as np

from hetrl.learner.central import ActionChooser, CentralAssembler, CentralShapes
from hetrl.protos import hetrl_pb2, hetrl_pb2_grpc
from hetrl.rollout import fragments
from hetrl.rollout.errors import ProtocolError, WireFormatError
from hetrl.rollout.observations import ObsLayout
from hetrl.rollout.serving import STARTING
from hetrl.rollout.transport import DEFAULT_OPTIONS, TransportOptions, auth_metadata, create_channel

log = logging.getLogger("hetrl.learner")


# Retrying cannot fix these: the token is wrong or the peer is not a hetrl worker.
_FATAL_CODES = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
}


STARTING_TOLD_EVERY = 30.0
"""Seconds between the lines that say what a starting worker is doing."""

# Counters every WorkerStream keeps; `stream_counters` sums them for the run summary.
COUNTERS = ("fragments_received", "fragments_malformed", "fragments_duplicate",
            "fragments_nonfinite", "sequence_gaps", "reconnects", "env_faults",
            "episodes_aborted", "env_steps_malformed", "env_steps_lost")


def fan_in_bound(streams: int, credits: int) -> int:
    """Capacity of the fan-in queue: every credit of every stream, twice (a replaced
    stream's fragments may still be queued when its successor gets fresh credits), plus
    one failure notice per stream."""
    return streams * (2 * credits + 1)


def stream_counters(streams) -> dict[str, int]:
    """The fault counters of all streams, summed (for the run summary)."""
    return {name: sum(getattr(s, name) for s in streams) for name in COUNTERS}


class CreditSink(Protocol):
    """Whatever a fragment's credit goes back to: a `WorkerStream` (or a test's fake)."""

    def return_credit(self, generation: int) -> None: ...


class StreamState(enum.Enum):
    CONNECTING = "connecting"
    STREAMING = "streaming"
    CLOSED = "closed"


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """What every worker must announce, and the shapes its fragments must have."""

    env: str
    observation_space: str
    action_space: str
    obs_layout: ObsLayout
    action_shape: tuple[int, ...]
    action_dtype: np.dtype
    state_size: int = 0
    """A recurrent policy's hidden state per env (fragments carry it); 0: feed-forward."""


@dataclasses.dataclass
class StreamFailure:
    """Put on the fan-in queue when a stream fails for good."""

    address: str
    error: Exception


class _Outbox:
    """Request queue: newest weights and summed credits (coalesced), central inference's
    actions (in order, at most one per env group), stop."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.weights: hetrl_pb2.Weights | None = None
        self.credits = 0
        self.actions: list[hetrl_pb2.Actions] = []
        self.stop: str | None = None
        self.closed = False

    def messages(self):
        """Request iterator handed to gRPC; ends after a stop or when closed."""
        while True:
            with self.cond:
                self.cond.wait_for(
                    lambda: self.closed or self.stop is not None or self.weights or self.credits
                    or self.actions
                )
                if self.closed:
                    return
                weights, self.weights = self.weights, None
                credits, self.credits = self.credits, 0
                actions, self.actions = self.actions, []
                stop = self.stop
            for message in actions:
                yield hetrl_pb2.LearnerMessage(actions=message)
            if weights is not None:
                yield hetrl_pb2.LearnerMessage(weights=weights)
            if credits:
                yield hetrl_pb2.LearnerMessage(credits=hetrl_pb2.Credits(count=credits))
            if stop is not None:
                yield hetrl_pb2.LearnerMessage(stop=hetrl_pb2.Stop(reason=stop))
                return

    def put(self, weights=None, credits: int = 0, stop: str | None = None) -> None:
        with self.cond:
            if weights is not None:
                self.weights = weights
            self.credits += credits
            if stop is not None:
                self.stop = stop
            self.cond.notify_all()

    def put_actions(self, actions: hetrl_pb2.Actions) -> None:
        with self.cond:
            self.actions.append(actions)
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class WorkerStream:
    """The learner's side of one worker's stream."""

    def __init__(
        self,
        address: str,
        token: str,
        spec: StreamSpec,
        fan_in: queue.Queue,
        weights: hetrl_pb2.Weights,
        credits: int,
        connect_timeout: float,
        options: TransportOptions = DEFAULT_OPTIONS,
        nonfinite: str = "drop",
        inference: ActionChooser | None = None,
    ) -> None:
        self.address, self.spec, self.fan_in = address, spec, fan_in
        # Central inference: the learner chooses the actions and builds the fragments.
        self.inference = inference
        self._assembler: CentralAssembler | None = None
        self._metadata = auth_metadata(token)
        self._weights = weights
        self._credits = credits
        self._connect_timeout = connect_timeout
        self._told_starting = -STARTING_TOLD_EVERY
        self._options, self._nonfinite = options, nonfinite
        self._outbox = _Outbox()
        self._stopping = threading.Event()
        self.state = StreamState.CONNECTING
        self.hello: hetrl_pb2.Hello | None = None
        # The counters named in COUNTERS (keep the two lists the same).
        self.fragments_received = 0
        self.fragments_malformed = 0
        self.fragments_duplicate = 0
        self.fragments_nonfinite = 0
        self.sequence_gaps = 0
        self.reconnects = 0
        self.env_faults = 0
        self.episodes_aborted = 0
        self.env_steps_malformed = 0
        self.env_steps_lost = 0
        self.incarnations: list[str] = []
        self._next_sequence: dict[str, int] = {}  # central: per incarnation
        self.generation = 0
        # Credits this stream's worker holds: fragments it may be sampling or sending
        # that have not arrived. A worker lost for good takes these with it.
        self.in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._last_sequence: dict[str, int] = {}
        self._channel: grpc.Channel | None = None
        self._thread = threading.Thread(target=self._run, name=f"stream-{address}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def push_weights(self, weights: hetrl_pb2.Weights) -> None:
        self._weights = weights
        self._outbox.put(weights=weights)

    def return_credit(self, generation: int) -> None:
        """Give the worker a credit back for a fragment of stream `generation`; credits
        of a stream that has since been replaced are void (the new one starts full)."""
        if generation == self.generation:
            with self._in_flight_lock:
                self.in_flight += 1
            assembler = self._assembler
            if self.inference is None:
                self._outbox.put(credits=1)
            elif assembler is not None:
                assembler.grant()

    def stop(self, reason: str, timeout: float = 10.0) -> bool:
        """Tell the worker to stop and wait (bounded) for its stream to end; a stream
        still open after `timeout` is closed. True if the stream ended by itself."""
        self._stopping.set()
        self._outbox.put(stop=reason)
        self._thread.join(timeout)
        ended = not self._thread.is_alive()
        if not ended and self._channel is not None:
            self._channel.close()
            self._thread.join(2.0)
        self._outbox.close()
        return ended

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the stream thread -------------------------------------------------------
    def _run(self) -> None:
        try:
            self._connect_and_stream()
        except Exception as exc:  # reported to the training loop, which decides
            if not self._stopping.is_set():
                self._put(StreamFailure(self.address, exc))
        finally:
            self.state = StreamState.CLOSED

    def _connect_and_stream(self) -> None:
        """Connect, stream, and reconnect after a lost stream, each time for up to
        connect_timeout; codes that retrying cannot fix end the stream at once."""
        self._channel = create_channel(self.address, self._options)
        stub = hetrl_pb2_grpc.RolloutStub(self._channel)
        deadline = time.monotonic() + self._connect_timeout
        while not self._stopping.is_set():
            try:
                if not self._wait_ready(deadline):
                    return  # stopped while waiting
                self._stream(stub)
                return
            except grpc.FutureTimeoutError as exc:
                if self.incarnations:  # it answered before: it is gone, not misaddressed
                    raise ConnectionError(
                        f"worker {self.address} has not come back within "
                        f"{self._connect_timeout:.0f} s (--connect-timeout): its process "
                        "ended and was not restarted, or its host is gone") from exc
                raise ConnectionError(
                    f"nothing answered at worker {self.address} within "
                    f"{self._connect_timeout:.0f} s (--connect-timeout); is it running, and "
                    "is the address right?"
                ) from exc
            except (grpc.RpcError, ConnectionError) as exc:
                if self._stopping.is_set():
                    return
                code = exc.code() if isinstance(exc, grpc.RpcError) else None
                detail = str(exc)
                if code and isinstance(exc, grpc.RpcError):
                    detail = f"{code.name} {exc.details()}"
                if code in _FATAL_CODES:
                    raise ConnectionError(f"worker {self.address} refused: {detail}") from exc
                if (code == grpc.StatusCode.UNAVAILABLE and isinstance(exc, grpc.RpcError)
                        and (exc.details() or "").startswith(STARTING)):
                    # It answers and its start-up moves on (a stuck one ends itself, its
                    # watchdog): the clock restarts, and what it does is said now and then.
                    deadline = time.monotonic() + self._connect_timeout
                    if time.monotonic() - self._told_starting >= STARTING_TOLD_EVERY:
                        self._told_starting = time.monotonic()
                        log.info("worker %s is %s", self.address, exc.details())
                    time.sleep(0.5)
                    continue
                if self.state is StreamState.STREAMING:
                    self.reconnects += 1
                    log.warning("lost worker %s (%s); reconnecting for up to %.0f s",
                                self.address, detail, self._connect_timeout)
                    deadline = time.monotonic() + self._connect_timeout
                    self.state = StreamState.CONNECTING
                if time.monotonic() >= deadline:
                    raise ConnectionError(
                        f"stream to worker {self.address} failed: {detail}"
                    ) from exc
                time.sleep(0.5)

    def _wait_ready(self, deadline: float) -> bool:
        """Wait until the channel connects or `deadline` passes (FutureTimeoutError), in
        short slices so that a stop is never held up by a worker that is gone; False if
        the stream is being stopped."""
        assert self._channel is not None
        ready = grpc.channel_ready_future(self._channel)
        try:
            while not self._stopping.is_set():
                try:
                    ready.result(timeout=min(0.5, max(0.1, deadline - time.monotonic())))
                    return True
                except grpc.FutureTimeoutError:
                    if time.monotonic() >= deadline:
                        raise
            return False
        finally:
            ready.cancel()

    def _stream(self, stub: hetrl_pb2_grpc.RolloutStub) -> None:
        self.generation += 1
        generation = self.generation
        self._outbox = _Outbox()
        with self._in_flight_lock:
            self.in_flight = self._credits
        if self.inference is None:
            self._outbox.put(weights=self._weights, credits=self._credits)
        responses = stub.Stream(self._outbox.messages(), metadata=self._metadata)
        first = next(responses)
        if first.WhichOneof("kind") != "hello":
            raise ProtocolError(f"worker {self.address} did not start with Hello")
        self._check_hello(first.hello)
        self.hello = first.hello
        spec = self.spec
        expected = fragments.expected_steps(
            first.hello.fragment_length, first.hello.num_envs, spec.obs_layout,
            spec.action_shape, spec.action_dtype, spec.state_size)
        if first.hello.incarnation not in self.incarnations:
            self.incarnations.append(first.hello.incarnation)
        self.state = StreamState.STREAMING
        log.info("streaming from worker %d at %s (inference %s)", first.hello.worker_id,
                 self.address, self.hello.inference or "worker")
        if self.inference is not None:
            self._stream_central(responses, generation)
            return
        for message in responses:
            if message.WhichOneof("kind") != "fragment":
                raise ProtocolError(f"worker {self.address} sent {message.WhichOneof('kind')}")
            with self._in_flight_lock:
                self.in_flight -= 1
            try:
                fragment = fragments.from_message(message.fragment, expected)
                self._check_origin(fragment)
            except WireFormatError as exc:
                self.fragments_malformed += 1
                log.error("malformed fragment from %s dropped: %s", self.address, exc)
                self.return_credit(generation)
                continue
            self._accept(fragment, generation)
        if not self._stopping.is_set():
            raise ConnectionError(f"worker {self.address} ended its stream unasked")

    def _stream_central(self, responses, generation: int) -> None:
        """Central inference: env steps in, actions out, fragments built here. A stream
        that breaks, or sends a malformed step, loses its unfinished fragments (counted);
        the worker resets its envs on the next stream, so nothing spans two streams."""
        assert self.hello is not None and self.inference is not None
        spec = self.spec
        shapes = CentralShapes(spec.obs_layout, spec.action_shape, spec.action_dtype,
                               spec.state_size)
        outbox = self._outbox
        assembler = CentralAssembler(self.hello, shapes, self._credits, self.inference,
                                     send=outbox.put_actions)
        self._assembler = assembler
        incarnation = self.hello.incarnation
        try:
            for message in responses:
                if message.WhichOneof("kind") != "env_step":
                    raise ProtocolError(
                        f"worker {self.address} sent {message.WhichOneof('kind')} on a "
                        "central-inference stream")
                try:
                    completed = assembler.on_env_step(message.env_step)
                except WireFormatError as exc:
                    self.env_steps_malformed += 1
                    log.error("malformed env step from %s: %s; reconnecting (the worker "
                              "resets its envs)", self.address, exc)
                    raise ConnectionError(f"malformed env step: {exc}") from exc
                for arrays, version, waited in completed:
                    with self._in_flight_lock:
                        self.in_flight -= 1
                    sequence = self._next_sequence.get(incarnation, 0)
                    self._next_sequence[incarnation] = sequence + 1
                    self._accept(fragments.ReceivedFragment(
                        self.hello.worker_id, incarnation, sequence, version, arrays,
                        waited), generation)
            if not self._stopping.is_set():
                raise ConnectionError(f"worker {self.address} ended its stream unasked")
        finally:
            self._assembler = None
            outbox.close()
            lost = assembler.close()
            self.env_steps_lost += lost
            if lost and not self._stopping.is_set():
                log.warning("stream of worker %s ended with %d env steps of unfinished "
                            "fragments; dropped", self.address, lost)
            responses.cancel()

    def _accept(self, fragment: fragments.ReceivedFragment, generation: int) -> None:
        """The checks every fragment passes, however it was built, then the fan-in."""
        if not self._note_sequence(fragment):
            self.return_credit(generation)
            return
        self.fragments_received += 1
        self.env_faults += fragment.arrays.env_faults
        self.episodes_aborted += fragment.arrays.episodes_aborted
        bad = fragments.nonfinite_fields(fragment.arrays)
        if bad:
            self.fragments_nonfinite += 1
            if self._nonfinite == "fail":
                raise ProtocolError(f"worker {self.address} sent NaN/Inf in {bad} "
                                    "(--nonfinite fail)")
            log.error("fragment %d from %s holds NaN/Inf in %s; dropped",
                      fragment.sequence, self.address, bad)
            self.return_credit(generation)
            return
        self._put((self, generation, fragment))

    def _put(self, item) -> None:
        """Put on the bounded fan-in queue, waiting while it is full (back-pressure),
        unless this stream is being stopped."""
        while not self._stopping.is_set():
            try:
                self.fan_in.put(item, timeout=1.0)
                return
            except queue.Full:
                continue

    def _check_origin(self, fragment: fragments.ReceivedFragment) -> None:
        assert self.hello is not None
        if (fragment.incarnation, fragment.worker_id) != (self.hello.incarnation,
                                                          self.hello.worker_id):
            raise WireFormatError(
                f"fragment from worker {fragment.worker_id} incarnation {fragment.incarnation} "
                f"on the stream of worker {self.hello.worker_id} incarnation "
                f"{self.hello.incarnation}"
            )

    def _note_sequence(self, fragment: fragments.ReceivedFragment) -> bool:
        """Record the fragment's sequence; False (and counted) if it was seen before."""
        last = self._last_sequence.get(fragment.incarnation)
        if last is not None and fragment.sequence <= last:
            self.fragments_duplicate += 1
            log.error("worker %s sent sequence %d of incarnation %s again; dropped",
                      self.address, fragment.sequence, fragment.incarnation)
            return False
        if last is not None and fragment.sequence != last + 1:
            self.sequence_gaps += 1
            log.warning(
                "worker %s skipped fragments %d..%d (lost in transit)",
                self.address, last + 1, fragment.sequence - 1,
            )
        self._last_sequence[fragment.incarnation] = fragment.sequence
        return True

    def _check_hello(self, hello: hetrl_pb2.Hello) -> None:
        mine = (self.spec.env, self.spec.observation_space, self.spec.action_space)
        theirs = (hello.env, hello.observation_space, hello.action_space)
        if mine != theirs:
            raise ProtocolError(
                f"worker {self.address} simulates {theirs}, the learner expects {mine}: "
                "start workers and learner with the same --env and --env-import"
            )
        wanted = "worker" if self.inference is None else "central"
        if (hello.inference or "worker") != wanted:
            raise ProtocolError(
                f"worker {self.address} runs --inference {hello.inference or 'worker'}, the "
                f"learner --inference {wanted}: give workers and learner the same one")
