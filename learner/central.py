"""The learner's side of a central-inference stream: fragments built from env steps and
the actions the learner chose, exactly as a worker's collector builds them.

`CentralAssembler` serves one generation of one stream. A `FragmentBuilder` per env
group (rollout/assembly.py, the collector's own bookkeeping) turns the worker's
EnvSteps and the chosen actions into fragments; the groups' fragments are joined into
one worker fragment, and rewards are normalised with the worker's settings (carried in
its Hello). Credits stay here: a group starts fragment k only once k credits were
granted, so what is in flight is bounded as in worker inference, and a credit returned
after an update comes after its weights were loaded into the inference thread, so policy
lag is what worker inference gives, or less. Malformed or out-of-turn steps raise
WireFormatError. It chooses no actions (an `ActionChooser` does: learner/inference.py)
and sends nothing itself (replies go out through the stream's outbox). No torch here:
the learner's connections import it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from hetrl.protos import hetrl_pb2
from hetrl.rollout import wire
from hetrl.rollout.assembly import FragmentBuilder, join_groups
from hetrl.rollout.env_server import group_sizes
from hetrl.rollout.errors import ProtocolError, WireFormatError
from hetrl.rollout.fragments import FragmentArrays, checked, decode_observations
from hetrl.rollout.observations import Obs, ObsLayout, all_finite
from hetrl.rollout.rewards import RewardNormalizer, training_rewards
from hetrl.rollout.stepping import StepResult

Reply = Callable[..., None]
"""(actions as sampled, their log-probabilities, actions as the env takes them, version,
and for a recurrent policy the envs' new hidden states)."""


class ActionChooser(Protocol):
    """Whatever chooses actions for observations: the inference thread (or a test's).
    A recurrent policy's `memory` is (each env's hidden state, which envs start an
    episode: their state is zeroed first)."""

    def submit(self, observations: Obs, reply: Reply,
               memory: tuple[np.ndarray, np.ndarray] | None = None) -> None: ...


@dataclasses.dataclass
class _Group:
    """One env group of a central stream: its builder and where it stands."""

    size: int
    builder: FragmentBuilder | None = None
    next_step: int = 0
    """The EnvStep number expected next from the worker."""
    chosen: tuple[np.ndarray, np.ndarray, int, np.ndarray | None] | None = None
    """Actions (as sampled), log-probs and version sent for the current observations."""
    started: int = 0
    """Fragments this group has begun (each needs a credit)."""
    parked: bool = False
    """Its current observations wait for a credit before actions are chosen."""
    parked_at: float = 0.0
    waited: float = 0.0
    oldest_version: int | None = None
    done: list[tuple[FragmentArrays, int, float]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class CentralShapes:
    """What a central stream's steps must look like (from the learner's env)."""

    obs_layout: ObsLayout
    action_shape: tuple[int, ...]
    action_dtype: np.dtype
    state_size: int = 0


class CentralAssembler:
    """The learner's side of one generation of one central stream."""

    def __init__(self, hello: hetrl_pb2.Hello, shapes: CentralShapes, credits: int,
                 inference: ActionChooser,
                 send: Callable[[hetrl_pb2.Actions], None]) -> None:
        if hello.num_envs < 1 or hello.fragment_length < 1:
            raise ProtocolError(f"worker {hello.worker_id} announced {hello.num_envs} envs "
                                f"and fragments of {hello.fragment_length} steps")
        sizes = group_sizes(hello.num_envs)
        if hello.env_groups != len(sizes):
            raise ProtocolError(f"worker {hello.worker_id} announced {hello.env_groups} env "
                                f"groups of {hello.num_envs} envs; this learner expects "
                                f"{len(sizes)} (a different hetrl version?)")
        self.shapes, self.length = shapes, hello.fragment_length
        self.inference, self._send = inference, send
        self.groups = [_Group(n) for n in sizes]
        self.granted = credits
        self.clip_rewards = hello.clip_rewards
        self.normalizer = (RewardNormalizer(hello.num_envs, hello.reward_norm_gamma,
                                            hello.reward_clip)
                           if hello.normalize_rewards else None)
        self._lock = threading.Lock()
        self._closed = False

    # -- the stream thread -------------------------------------------------------
    def on_env_step(self, message: hetrl_pb2.EnvStep
                    ) -> list[tuple[FragmentArrays, int, float]]:
        """Take one EnvStep; return the worker fragments it completed, each with the
        oldest policy version that chose its actions and the seconds it waited for a
        credit.

        Raises:
            WireFormatError: an unknown group, a step out of turn, wrong shapes or dtypes,
                or NaN/Inf.
        """
        if message.group >= len(self.groups):
            raise WireFormatError(f"env step for group {message.group} of "
                                  f"{len(self.groups)}")
        group = self.groups[message.group]
        # Frame stacks arrive as their new frames after the observations this group's
        # builder holds from the step before (the stream's thread alone changes them).
        held = group.builder.obs if group.builder is not None and message.step else None
        result = self._decode(message, group.size, held)
        submit = False
        with self._lock:
            if message.step != group.next_step or (message.step and group.chosen is None):
                raise WireFormatError(f"env step {message.step} of group {message.group} "
                                      f"out of turn (expected {group.next_step})")
            group.next_step += 1
            if group.builder is None:
                s = self.shapes
                group.builder = FragmentBuilder(group.size, self.length, s.obs_layout,
                                                s.action_shape, s.action_dtype,
                                                result.observations, s.state_size)
            else:
                assert group.chosen is not None
                actions, logprobs, version, state = group.chosen
                group.chosen = None
                if group.oldest_version is None:
                    group.oldest_version = version
                fragment = group.builder.record(actions, logprobs, result, state)
                if fragment is not None:
                    group.done.append((fragment, group.oldest_version, group.waited))
                    group.oldest_version, group.waited = None, 0.0
            if group.builder.t > 0 or group.started < self.granted:
                group.started += group.builder.t == 0
                submit = True
            else:
                group.parked, group.parked_at = True, time.perf_counter()
            completed = self._join_completed()
        if submit:
            self._choose(message.group)
        return completed

    def _decode(self, message: hetrl_pb2.EnvStep, n: int, previous: Obs | None = None
                ) -> StepResult:
        expected = {"rewards": ((n,), np.dtype(np.float32)),
                    "terminated": ((n,), np.dtype(bool)), "truncated": ((n,), np.dtype(bool)),
                    "faulted": ((n,), np.dtype(bool))}
        arrays: dict[str, Any] = {"observations": decode_observations(
            message, self.shapes.obs_layout.expected(n), "env step observations",
            previous if isinstance(previous, np.ndarray) else None)}
        if not all_finite(arrays["observations"]):
            raise WireFormatError("env step observations hold NaN or Inf")
        if message.HasField("life_lost"):
            expected["life_lost"] = ((n,), np.dtype(bool))
        for name, shape_dtype in expected.items():
            array = checked(wire.decode(getattr(message, name)), shape_dtype, f"env step {name}")
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise WireFormatError(f"env step {name} holds NaN or Inf")
            arrays[name] = array
        return StepResult(**arrays)

    def _join_completed(self) -> list[tuple[FragmentArrays, int, float]]:
        out = []
        while all(g.done for g in self.groups):
            parts = [g.done.pop(0) for g in self.groups]
            fragment = join_groups([p[0] for p in parts])
            fragment.rewards = training_rewards(  # the episode returns stay raw
                fragment.rewards, fragment.terminated, fragment.truncated, fragment.valid,
                self.clip_rewards, self.normalizer)
            waited = max(p[2] for p in parts)
            # The builder's clock ran while the group waited for its credit: not collecting.
            fragment.collect_seconds = max(0.0, fragment.collect_seconds - waited)
            out.append((fragment, min(p[1] for p in parts), waited))
        return out

    def _choose(self, index: int) -> None:
        group = self.groups[index]
        assert group.builder is not None
        step = group.next_step - 1

        def reply(actions: np.ndarray, logprobs: np.ndarray, env_actions: np.ndarray,
                  version: int, state: np.ndarray | None = None) -> None:
            with self._lock:
                if self._closed:
                    return
                group.chosen = (actions, logprobs, version, state)
            self._send(hetrl_pb2.Actions(group=index, step=step,
                                         actions=wire.encode(np.ascontiguousarray(env_actions))))

        builder = group.builder
        memory = None if builder.state is None else (builder.state, builder.starting)
        self.inference.submit(builder.obs, reply, memory)

    # -- the batcher's or publisher's thread ---------------------------------------
    def grant(self) -> None:
        """One more fragment may be started; a group waiting for it goes on."""
        waiting = []
        with self._lock:
            self.granted += 1
            for index, group in enumerate(self.groups):
                if group.parked and group.started < self.granted:
                    group.parked = False
                    group.started += 1
                    group.waited += time.perf_counter() - group.parked_at
                    waiting.append(index)
        for index in waiting:
            self._choose(index)

    def close(self) -> int:
        """The stream ended: discard what was not finished; return the env steps lost."""
        with self._lock:
            self._closed = True
            lost = sum(g.builder.t * g.size for g in self.groups if g.builder is not None)
            lost += sum(len(g.done) * self.length * g.size for g in self.groups)
        return lost


