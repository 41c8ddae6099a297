"""Weights out: serialize each new policy version once and push it to every worker stream,
off the training thread.

The training thread `offer`s a snapshot of the state dict (device tensors cloned after a
finite update, so the next update cannot change them) and goes on training. A named
thread ("weights-publisher") takes the newest offered snapshot, copies it to the host (on
CUDA: on its own stream, after an event, so the copy overlaps the next update), encodes it
once as a Weights message and hands it to every stream, whose outbox keeps only the newest.
Older snapshots not yet published are skipped: workers always get the newest weights,
never a backlog. A failed publication is logged and counted (the workers keep their
last weights); MAX_FAILURES_IN_A_ROW of them end the run through `check`, which the
training thread calls. Under central inference no worker takes weights: the snapshot is loaded
into the inference thread's copy of the policy instead (learner/inference.py), and the
credits held meanwhile still go out only after it. It never trains and never decides
which weights are good.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from hetrl.learner.connections import CreditSink
from hetrl.learner.inference import InferenceServer
from hetrl.protos import hetrl_pb2
from hetrl.rollout import wire
from hetrl.rollout.errors import HetrlError

log = logging.getLogger("hetrl.learner")

MAX_FAILURES_IN_A_ROW = 3
"""Failed publications in a row that end the run (a single one is counted and survived)."""


def weights_message(version: int, state: dict[str, torch.Tensor]) -> hetrl_pb2.Weights:
    """The Weights message of a state dict (host or device tensors)."""
    arrays: dict[str, np.ndarray] = {k: v.detach().cpu().numpy() for k, v in state.items()}
    return hetrl_pb2.Weights(version=version, arrays=wire.encode_named(arrays))


class Publisher:
    """The weights-publisher thread: newest snapshot -> one message -> every stream."""

    def __init__(self, streams: Sequence, device: torch.device,
                 on_published: Callable[[hetrl_pb2.Weights], None] | None = None,
                 inference: InferenceServer | None = None) -> None:
        self.streams, self.device = streams, device
        self.inference = inference
        self._on_published = on_published
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        self._cond = threading.Condition()
        self._pending: tuple[int, dict[str, torch.Tensor], torch.cuda.Event | None] | None = None
        self._closed = False
        self._publishing = False
        self._deferred: list[tuple[CreditSink, int]] = []
        self.published_version = -1
        self.skipped = 0
        self.failures = 0
        self._failures_in_a_row = 0
        self.failure: BaseException | None = None
        """Set after MAX_FAILURES_IN_A_ROW failed publications: workers would sample
        with ever older weights, so the run ends (see `check`)."""
        self._thread = threading.Thread(target=self._run, name="weights-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Publish `state` (tensors nobody will modify) as `version`, soon and off this
        thread; replaces an older offer not yet taken."""
        event = None
        if self._cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        with self._cond:
            if self._pending is not None:
                self.skipped += 1
            self._pending = (version, state, event)
            self._cond.notify_all()

    def check(self) -> None:
        """Raise if publishing has failed too often in a row to train on.

        Raises:
            HetrlError: naming the last failure.
        """
        if self.failure is not None:
            raise HetrlError(f"publishing weights failed {MAX_FAILURES_IN_A_ROW} times in a "
                             f"row, the last: {self.failure!r}; the workers would keep "
                             "sampling with old weights")

    def return_credit(self, stream: CreditSink, generation: int) -> None:
        """Return a worker's credit, but never before the newest offered weights have
        been pushed: the worker then samples its next fragment with them."""
        with self._cond:
            if self._pending is not None or self._publishing:
                self._deferred.append((stream, generation))
                return
        stream.return_credit(generation)

    def close(self, timeout: float = 5.0) -> None:
        """Publish what is pending, then stop the thread (and return deferred credits)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        with self._cond:
            credits, self._deferred = self._deferred, []
        for stream, generation in credits:
            stream.return_credit(generation)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._pending is not None)
                if self._pending is None:
                    return
                (version, state, event), self._pending = self._pending, None
                self._publishing = True
            try:
                if self.inference is not None:
                    self.inference.load(version, state, event)
                else:
                    message = self._encode(version, state, event)
                    for stream in self.streams:
                        stream.push_weights(message)
                    if self._on_published is not None:
                        self._on_published(message)
                self.published_version = version
            except Exception as exc:  # workers keep their last weights; counted
                self.failures += 1
                self._failures_in_a_row += 1
                log.exception("publishing weights version %d failed (%d in a row)", version,
                              self._failures_in_a_row)
                if self._failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
                    self.failure = exc  # the training thread ends the run with it
            else:
                self._failures_in_a_row = 0
            with self._cond:
                self._publishing = False
                credits = [] if self._pending is not None else self._deferred
                if self._pending is None:
                    self._deferred = []
            for stream, generation in credits:  # after the weights, in each outbox
                stream.return_credit(generation)

    def _encode(self, version: int, state: dict[str, torch.Tensor],
                event: torch.cuda.Event | None) -> hetrl_pb2.Weights:
        if not self._cuda:
            return weights_message(version, state)
        assert self._stream is not None and event is not None
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(event)
            for tensor in state.values():
                tensor.record_stream(self._stream)
            host = {k: v.to("cpu") for k, v in state.items()}  # syncs this stream only
        return weights_message(version, host)
