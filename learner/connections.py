"""One client stream per rollout worker, all fanned into one bounded queue.

A `WorkerStream` owns a thread ("stream-<address>") that connects (retrying while the
worker is not up yet, for `connect_timeout`), checks the worker's Hello against the
learner's env, sends the newest weights and the initial credits, then decodes every
fragment and puts it on the shared queue. Outgoing messages are coalesced (newest
weights only, credits summed), so nothing the learner sends can pile up. The queue is
bounded by the credits: a worker never holds more than `credits` fragments in flight.
Malformed fragments are counted and their credit returned, never trained on.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import queue
import threading
import time

import grpc
import numpy as np

from protos import hetrl_pb2, hetrl_pb2_grpc
from rollout import fragments
from rollout.errors import ProtocolError, WireFormatError
from rollout.transport import auth_metadata, create_channel

log = logging.getLogger("hetrl.learner")


# Retrying cannot fix these: the token is wrong or the peer is not a hetrl worker.
_FATAL_CODES = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
}


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
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_shape: tuple[int, ...]
    action_dtype: np.dtype


@dataclasses.dataclass
class StreamFailure:
    """Put on the fan-in queue when a stream fails for good."""

    address: str
    error: Exception


class _Outbox:
    """Coalescing request queue: newest weights, summed credits, stop."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.weights: hetrl_pb2.Weights | None = None
        self.credits = 0
        self.stop: str | None = None
        self.closed = False

    def messages(self):
        """Request iterator handed to gRPC; ends after a stop or when closed."""
        while True:
            with self.cond:
                self.cond.wait_for(
                    lambda: self.closed or self.stop is not None or self.weights or self.credits
                )
                if self.closed:
                    return
                weights, self.weights = self.weights, None
                credits, self.credits = self.credits, 0
                stop = self.stop
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
    ) -> None:
        self.address, self.spec, self.fan_in = address, spec, fan_in
        self._metadata = auth_metadata(token)
        self._weights = weights
        self._credits = credits
        self._connect_timeout = connect_timeout
        self._outbox = _Outbox()
        self._stopping = threading.Event()
        self.state = StreamState.CONNECTING
        self.hello: hetrl_pb2.Hello | None = None
        self.fragments_received = 0
        self.fragments_malformed = 0
        self.sequence_gaps = 0
        self.reconnects = 0
        self.generation = 0
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
            self._outbox.put(credits=1)

    def stop(self, reason: str, timeout: float = 10.0) -> bool:
        """Tell the worker to stop and wait (bounded) for its stream to end."""
        self._stopping.set()
        self._outbox.put(stop=reason)
        self._thread.join(timeout)
        if self._thread.is_alive() and self._channel is not None:
            self._channel.close()
            self._thread.join(2.0)
        self._outbox.close()
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the stream thread -------------------------------------------------------
    def _run(self) -> None:
        try:
            self._connect_and_stream()
        except Exception as exc:  # reported to the training loop, which decides
            if not self._stopping.is_set():
                self.fan_in.put(StreamFailure(self.address, exc))
        finally:
            self.state = StreamState.CLOSED

    def _connect_and_stream(self) -> None:
        """Connect, stream, and reconnect after a lost stream, each time for up to
        connect_timeout; codes that retrying cannot fix end the stream at once."""
        self._channel = create_channel(self.address)
        stub = hetrl_pb2_grpc.RolloutStub(self._channel)
        deadline = time.monotonic() + self._connect_timeout
        while not self._stopping.is_set():
            try:
                grpc.channel_ready_future(self._channel).result(
                    timeout=max(0.1, deadline - time.monotonic())
                )
                self._stream(stub)
                return
            except grpc.FutureTimeoutError as exc:
                raise ConnectionError(
                    f"worker {self.address} not reachable within {self._connect_timeout:.0f} s "
                    "(--connect-timeout); is it running, and is the address right?"
                ) from exc
            except (grpc.RpcError, ConnectionError) as exc:
                if self._stopping.is_set():
                    return
                code = exc.code() if isinstance(exc, grpc.RpcError) else None
                detail = f"{code.name} {exc.details()}" if code else str(exc)
                if code in _FATAL_CODES:
                    raise ConnectionError(f"worker {self.address} refused: {detail}") from exc
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

    def _stream(self, stub: hetrl_pb2_grpc.RolloutStub) -> None:
        self.generation += 1
        generation = self.generation
        self._outbox = _Outbox()
        self._outbox.put(weights=self._weights, credits=self._credits)
        responses = stub.Stream(self._outbox.messages(), metadata=self._metadata)
        first = next(responses)
        if first.WhichOneof("kind") != "hello":
            raise ProtocolError(f"worker {self.address} did not start with Hello")
        self._check_hello(first.hello)
        self.hello = first.hello
        self.state = StreamState.STREAMING
        log.info("streaming from worker %d at %s", first.hello.worker_id, self.address)
        for message in responses:
            if message.WhichOneof("kind") != "fragment":
                raise ProtocolError(f"worker {self.address} sent {message.WhichOneof('kind')}")
            try:
                fragment = fragments.from_message(
                    message.fragment,
                    self.hello.fragment_length,
                    self.hello.num_envs,
                    self.spec.obs_shape,
                    self.spec.obs_dtype,
                    self.spec.action_shape,
                    self.spec.action_dtype,
                )
            except WireFormatError as exc:
                self.fragments_malformed += 1
                log.error("malformed fragment from %s dropped: %s", self.address, exc)
                self.return_credit(generation)
                continue
            self._note_sequence(fragment)
            self.fragments_received += 1
            self.fan_in.put((self, generation, fragment))
        if not self._stopping.is_set():
            raise ConnectionError(f"worker {self.address} ended its stream unasked")

    def _note_sequence(self, fragment: fragments.Fragment) -> None:
        last = self._last_sequence.get(fragment.incarnation)
        if last is not None and fragment.sequence != last + 1:
            self.sequence_gaps += 1
            log.warning(
                "worker %s skipped fragments %d..%d (lost in transit)",
                self.address, last + 1, fragment.sequence - 1,
            )
        self._last_sequence[fragment.incarnation] = fragment.sequence

    def _check_hello(self, hello: hetrl_pb2.Hello) -> None:
        mine = (self.spec.env, self.spec.observation_space, self.spec.action_space)
        theirs = (hello.env, hello.observation_space, hello.action_space)
        if mine != theirs:
            raise ProtocolError(
                f"worker {self.address} simulates {theirs}, the learner expects {mine}: "
                "start workers and learner with the same --env and --env-import"
            )
