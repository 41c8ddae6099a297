"""The learner's ingest pipeline: fragments off the fan-in queue into ready training batches.

A named thread ("batcher") takes fragments off the fan-in queue, returns each one's
credit once the batches ahead of its own have trained (so prefetching adds no policy
lag; --synchronous: once its own has, so every fragment is sampled with the newest
weights), counts steps, episodes and policy lag, drops (and counts) fragments older than
`max_policy_lag`, and copies the rest into one of two preallocated host batches
(pinned on CUDA, so that the copy to the GPU is asynchronous). A full batch is copied to
the device on a side stream (CUDA) and handed to the training thread with an event to
wait on; on CPU the host buffers are the batch. So the next batch is received, decoded,
assembled and copied while the current one trains, and the training thread only ever
waits when experience is short. It never trains, never touches the policy, and holds at
most one batch beyond the one in training (two host slots), so lag stays bounded.

The GIL: the stream threads decode (protobuf parse, `np.frombuffer`) and this thread
copies with numpy, both of which release the GIL for the bulk copies; the training
thread spends its time in torch kernels, which release it too. bench/learner_scale.py
measures what is left (ingest vs the update-only ceiling of the same batch).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch

from hetrl.learner.connections import CreditSink, StreamFailure
from hetrl.learner.ppo import Batch
from hetrl.learner.stalls import StallWatch
from hetrl.rollout.errors import HetrlError, ProtocolError, WorkerLostError
from hetrl.rollout.fragments import ReceivedFragment, flat_steps, nested_steps
from hetrl.rollout.models import RETURN_WINDOW
from hetrl.rollout.observations import tree_map

log = logging.getLogger("hetrl.learner")

# Dropped stale fragments are routine now and then (a worker descheduled for a moment);
# past this share of the fragments, after this many, the run is told once.
DROP_WARN_SHARE = 0.05
DROP_WARN_AFTER = 100


@dataclasses.dataclass
class FragmentInfo:
    """What the books need of a trained fragment once its arrays are in the batch."""

    policy_version: int
    wait_seconds: float
    collect_seconds: float


@dataclasses.dataclass
class ReadyBatch:
    """A batch on the learner's device (or on its way there) and the facts about it."""

    batch: Batch
    infos: list[FragmentInfo]
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    wait_seconds: float
    """Seconds the batcher waited on the fan-in queue while assembling it."""
    slot: _HostSlot
    copied: torch.cuda.Event | None = None


class _HostSlot:
    """Preallocated host arrays for one batch: [T(+1), columns, ...] per field."""

    def __init__(self, layout: dict[str, tuple[tuple[int, ...], np.dtype]], columns: int,
                 pin: bool) -> None:
        self.layout, self.columns = layout, columns
        self.tensors = {
            name: torch.empty((shape[0], columns, *shape[1:]),
                              dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=pin)
            for name, (shape, dtype) in layout.items()
        }
        self.arrays = {name: t.numpy() for name, t in self.tensors.items()}

    def fits(self, layout: dict, columns: int) -> bool:
        return self.layout == layout and self.columns >= columns


def _fields(batch: Batch) -> dict:
    """Batch's fields by name, the tensors themselves (dataclasses.asdict deep-copies)."""
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}


def _layout(arrays: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Per step array (`flat_steps`): its shape without the env axis, and its dtype."""
    return {name: ((array.shape[0], *array.shape[2:]), array.dtype)
            for name, array in arrays.items()}


class Batcher:
    """The batcher thread and its two host slots; the training thread calls `next`."""

    def __init__(
        self,
        fan_in: queue.Queue,
        streams: Sequence,
        device: torch.device,
        target: Callable[[], int],
        version: int,
        max_policy_lag: int,
        budget_spent: Callable[[], bool],
        return_credit: Callable[[CreditSink, int], None] | None = None,
        stall: StallWatch | None = None,
        on_lost: Callable[[StreamFailure], None] | None = None,
        one_per_stream: bool = False,
        synchronous: bool = False,
    ) -> None:
        self.fan_in, self.streams, self.device = fan_in, streams, device
        # Central inference: at most one fragment per stream in a batch. A second one is
        # set aside, its credit kept, and opens the next batch; so no update happens
        # without every worker's fragment, and none spans two updates (lag 0 or 1).
        self._one_per_stream = one_per_stream
        self._set_aside: list[tuple[CreditSink, int, ReceivedFragment]] = []
        self._stall, self._on_lost = stall, on_lost
        self._return_credit = return_credit or (lambda stream, gen: stream.return_credit(gen))
        # Where training stands, under one lock with the credits it decides: batches are
        # numbered as they are handed out; `_assembling` is the number of the one being
        # built, `_done` how many updates have ended, `_version` the policy version after
        # the last of them. The batch being built trains at `_version` plus one per
        # batch ahead of it (the one training, and one assembled but not yet started).
        # A fragment's credit is held back until every batch before its own has trained
        # and offered its weights, so the worker samples its next fragment with the
        # weights its own batch trains at (as a serial learner would): prefetching never
        # adds policy lag. Every batch ahead has been handed out, so held credits always
        # come back, and a batch larger than all the credits still fills.
        # --synchronous holds every credit until the fragment's own batch has trained:
        # the worker's next fragment is sampled with the weights that batch made (lag 0).
        self._synchronous = synchronous
        self._credit_lock = threading.Lock()
        self._assembling = 0
        self._done = 0
        self._version = version
        # (updates that must have ended, stream, generation) of each credit held back
        self._held: list[tuple[int, CreditSink, int]] = []
        self._target = target
        self._max_policy_lag, self._budget_spent = max_policy_lag, budget_spent
        self._cuda = device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(device) if self._cuda else None
        self._free: queue.Queue[_HostSlot | None] = queue.Queue()
        for _ in range(2):
            self._free.put(None)  # allocated on first use, when the layout is known
        # Unbounded, yet never more than the two slots plus one end marker or error.
        self._ready: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.spent = False
        """True once the batcher has stopped assembling (budget spent or stopped)."""
        self._thread = threading.Thread(target=self._run, name="batcher", daemon=True)
        # The books the batcher keeps; the training thread only reads them.
        self.global_step = 0
        self.episodes = 0
        self.dropped_lag = 0
        self._warned_drops = False
        self.lag_histogram: collections.Counter[int] = collections.Counter()
        self.recent_returns: collections.deque[float] = collections.deque(
            maxlen=RETURN_WINDOW)
        # global_step and recent_returns change together, on this thread; `progress`
        # reads them together (the best policy and its metrics row must name one step).
        self._books_lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop assembling; fragments already taken are neither trained nor requeued."""
        self._stop.set()
        self._thread.join(5.0)

    def next(self, timeout: float) -> ReadyBatch | None:
        """The next batch, ready to train on (the device copy waited for), or None if none
        came within `timeout` or the step budget is spent.

        Raises:
            ProtocolError, WorkerLostError: what the batcher ran into (streams failing).
        """
        try:
            item = self._ready.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        if item is None:
            self.spent = True
            self._ready.put(None)  # stays "spent" for every later call
            return None
        if item.copied is not None:  # CUDA: the training stream waits for the copy
            current = torch.cuda.current_stream(self.device)
            current.wait_event(item.copied)
            for value in _fields(item.batch).values():
                for tensor in (value.values() if isinstance(value, dict) else [value]):
                    if isinstance(tensor, torch.Tensor):
                        tensor.record_stream(current)
        return item

    def update_done(self, version: int) -> list[tuple[CreditSink, int]]:
        """The training thread ended the update of the oldest batch handed out (its
        weights, now `version`, offered; or rejected, `version` unchanged): the credits
        now due, for the caller to return once those weights are on their way."""
        with self._credit_lock:
            self._done += 1
            self._version = version
            due = [(stream, gen) for batch, stream, gen in self._held if batch <= self._done]
            self._held = [held for held in self._held if held[0] > self._done]
        return due

    def _credit(self, stream: CreditSink, generation: int) -> int:
        """Return (or hold back) the credit of a fragment taken into the batch being
        built; return the policy version that batch will train at."""
        with self._credit_lock:
            train_version = self._version + self._assembling - self._done
            due_after = self._assembling + 1 if self._synchronous else self._assembling
            if self._done < due_after:
                self._held.append((due_after, stream, generation))
                return train_version
        self._return_credit(stream, generation)
        return train_version

    def release(self, ready: ReadyBatch) -> None:
        """The training thread is done with `ready`: its host slot may be refilled."""
        self._free.put(ready.slot)

    def progress(self) -> tuple[int, tuple[float, ...]]:
        """(global step, the last 100 episode returns) as of one moment."""
        with self._books_lock:
            return self.global_step, tuple(self.recent_returns)

    def counts(self, episodes_seen: int) -> tuple[int, int, list[float]]:
        """(global step, episodes, the returns of the episodes after the first
        `episodes_seen`, at most the last 100) as of one moment: a learner group's turn."""
        with self._books_lock:
            new = min(self.episodes - episodes_seen, len(self.recent_returns))
            returns = list(self.recent_returns)[len(self.recent_returns) - new:]
            return self.global_step, self.episodes, returns

    # -- the batcher thread ------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._budget_spent():
                    self._ready.put(None)
                    return
                slot = self._take(self._free)
                if slot is False:
                    return
                ready = self._assemble(slot)
                if ready is None:  # stopped, or the budget ran out with nothing taken
                    self._ready.put(None)
                    return
                with self._credit_lock:
                    self._assembling += 1
                self._ready.put(ready)
        except HetrlError as exc:
            self._ready.put(exc)
        except Exception as exc:  # a bug: the training thread must hear of it
            log.exception("the batcher failed")
            self._ready.put(HetrlError(f"the learner's batcher failed: {exc!r}"))

    def _take(self, source: queue.Queue):
        """Get from `source` unless stopped (then False)."""
        while not self._stop.is_set():
            try:
                return source.get(timeout=0.5)
            except queue.Empty:
                continue
        return False

    def _assemble(self, slot: _HostSlot | None) -> ReadyBatch | None:
        target = self._target()
        wait_start = time.perf_counter()
        waited = 0.0
        infos: list[FragmentInfo] = []
        returns: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        column = 0
        # One fragment per stream (central inference), unless more are asked for than
        # there are streams (a batch of --fragments-per-batch 4 from 2 workers).
        in_batch: set[int] | None = (set() if self._one_per_stream
                                     and target <= len(self.streams) else None)
        while len(infos) < target:
            if self._budget_spent():
                if not infos:
                    return None
                break  # train what is here; no more steps are wanted
            start = time.perf_counter()
            fragment = self._next_fragment(in_batch, self._short_enough(len(infos)))
            waited += time.perf_counter() - start
            if fragment is None:
                return None
            if fragment is False:
                continue
            if fragment is True:
                break  # a worker was lost since the batch began: train what is here
            arrays = flat_steps(fragment.arrays)
            layout = _layout(arrays)
            n = fragment.arrays.rewards.shape[1]
            if slot is None or not slot.fits(layout, column + n):
                slot = self._grow(slot, layout, column, max(target * n, column + n))
            for name, array in arrays.items():
                slot.arrays[name][:, column:column + n] = array
            column += n
            infos.append(FragmentInfo(fragment.policy_version, fragment.wait_seconds,
                                      fragment.arrays.collect_seconds))
            returns.append(fragment.arrays.episode_returns)
            lengths.append(fragment.arrays.episode_lengths)
        assert slot is not None
        batch = self._to_batch(slot, column)
        ready = ReadyBatch(batch, infos, np.concatenate(returns), np.concatenate(lengths),
                           waited, slot)
        if self._cuda:
            assert self._copy_stream is not None
            with torch.cuda.stream(self._copy_stream):
                # Any: Batch's fields differ in type (tensors, an int, Nones); matched by name.
                on_device: dict[str, Any] = {
                    name: (tree_map(lambda t: t.to(self.device, non_blocking=True), value)
                           if isinstance(value, (torch.Tensor, dict)) else value)
                    for name, value in _fields(batch).items()
                }
                ready.batch = Batch(**on_device)
                ready.copied = torch.cuda.Event()
                ready.copied.record(self._copy_stream)
        log.debug("batch of %d fragments assembled in %.3f s (%.3f s waiting)",
                  len(infos), time.perf_counter() - wait_start, waited)
        return ready

    def _grow(self, slot: _HostSlot | None, layout: dict, filled: int, columns: int
              ) -> _HostSlot:
        """A slot for `columns` columns of `layout`, keeping the `filled` ones already in."""
        if slot is not None and slot.layout != layout:
            raise ProtocolError(
                "workers send fragments of different shapes (e.g. --fragment-length); "
                "one learner needs them all alike")
        bigger = _HostSlot(layout, columns, pin=self._cuda)
        if slot is not None and filled:
            for name, array in slot.arrays.items():
                bigger.arrays[name][:, :filled] = array[:, :filled]
        return bigger

    @staticmethod
    def _to_batch(slot: _HostSlot, columns: int) -> Batch:
        tensors = {name: tensor[:, :columns] for name, tensor in slot.tensors.items()}
        # Which steps to train on, counted here on the host so that the update never
        # has to ask the device (a sync) how many there are.
        valid = slot.arrays["valid"][:, :columns].reshape(-1)
        count = int(np.count_nonzero(valid))
        index = None if count == valid.size else torch.from_numpy(np.flatnonzero(valid))
        return Batch(**nested_steps(tensors), valid_index=index, valid_count=count)

    def _short_enough(self, taken: int) -> Callable[[], bool] | None:
        """--synchronous: whether a batch of `taken` fragments is all it will get (a
        worker was lost for good with its credits since the batch began), asked while
        nothing arrives; None: a batch waits to be full."""
        if not self._synchronous or not taken:
            return None
        return lambda: taken >= self._target()

    def _next_fragment(self, in_batch: set[int] | None,
                       short_enough: Callable[[], bool] | None = None
                       ) -> ReceivedFragment | bool | None:
        """One fragment to train on; False if the one taken was dropped (or a failure was
        handled), True if `short_enough` says the batch ends without another, None if
        stopped. `in_batch`: ids of the streams already in this batch (kept up to date
        here), whose further fragments are set aside; None: take any.

        Raises:
            ProtocolError: a stream failed for a reason retrying cannot fix.
            WorkerLostError: every stream has ended.
        """
        while not self._stop.is_set():
            ready = [i for i, (stream, _, _) in enumerate(self._set_aside)
                     if in_batch is None or id(stream) not in in_batch]
            if ready:
                item = self._set_aside.pop(ready[0])
                return self._take_fragment(*item, in_batch)
            try:
                item = self.fan_in.get(timeout=0.5)
            except queue.Empty:
                if not any(stream.alive for stream in self.streams):
                    raise WorkerLostError(
                        "every worker stream has ended; nothing to train on") from None
                if short_enough is not None and short_enough():
                    return True
                if self._stall is not None:
                    # No worker holds a credit: every one waits for the learner's (held
                    # until an update ends, or owed by a long save), so none is stalled.
                    if not any(getattr(stream, "in_flight", 1) > 0 for stream in self.streams):
                        self._stall.excused()
                    else:
                        self._stall.waiting(len(self.streams))
                continue
            if isinstance(item, StreamFailure):
                self._on_stream_failure(item)
                return False
            stream, generation, fragment = item
            if self._stall is not None:
                self._stall.fragment(fragment.arrays.collect_seconds)
            if in_batch is not None and id(stream) in in_batch:
                self._set_aside.append(item)  # its credit stays out until it is taken
                continue
            return self._take_fragment(stream, generation, fragment, in_batch)
        return None

    def _take_fragment(self, stream: CreditSink, generation: int, fragment: ReceivedFragment,
                       in_batch: set[int] | None) -> ReceivedFragment | Literal[False]:
        """Count a fragment into the batch being built (or drop it for lag)."""
        train_version = self._credit(stream, generation)  # its next fragment may start
        returns = fragment.arrays.episode_returns
        with self._books_lock:
            self.global_step += fragment.steps
            self.recent_returns.extend(returns.tolist())
            self.episodes += len(returns)
        lag = train_version - fragment.policy_version
        self.lag_histogram[lag] += 1
        if lag > self._max_policy_lag:
            self.dropped_lag += 1
            # Counted (summary, progress line); worth a warning once it is not rare.
            log.debug("dropped a fragment %d updates old (--max-policy-lag %d)",
                      lag, self._max_policy_lag)
            taken = sum(self.lag_histogram.values())
            if (not self._warned_drops and taken >= DROP_WARN_AFTER
                    and self.dropped_lag > DROP_WARN_SHARE * taken):
                self._warned_drops = True
                log.warning("%d of %d fragments arrived more than --max-policy-lag %d "
                            "updates late and were dropped: some workers are much slower "
                            "than others (or stall); their experience is wasted. Give the "
                            "slow ones fewer envs, or raise --max-policy-lag",
                            self.dropped_lag, taken, self._max_policy_lag)
            return False
        if in_batch is not None:
            in_batch.add(id(stream))
        return fragment

    def _on_stream_failure(self, failure: StreamFailure) -> None:
        if isinstance(failure.error, ProtocolError):
            raise failure.error
        log.error("lost worker %s: %s", failure.address, failure.error)
        if self._on_lost is not None:
            self._on_lost(failure)
        if not any(stream.alive for stream in self.streams):
            raise WorkerLostError(f"every worker is gone; the last: {failure.error}")
