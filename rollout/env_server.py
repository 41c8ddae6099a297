"""The env server process (central inference): a worker that only steps envs, while the
learner chooses every action.

Its envs are split into `env_groups` vector envs (two when it has two or more envs)
that take turns: after Hello and one EnvStep per group (the observations after a
reset), every Actions message for a group is stepped at once and answered with that
group's next EnvStep. While the learner chooses one group's actions the other group
steps, which hides the round trip (SEED RL's double buffering). Actions arrive as the
env takes them (already clipped and rescaled by the learner), and the learner builds the
fragments, so this process holds no policy, no weights and no credits, and imports no
torch: an env host in central mode needs only gymnasium, numpy and gRPC.

Every stream starts with fresh episodes (all envs reset), so no transition spans two
streams: what the learner had of an unfinished fragment when a stream broke is
discarded there, and counted. Actions for an unknown group, out of turn, of the wrong
shape or dtype, or non-finite, and bytes that do not parse, are refused with
INVALID_ARGUMENT and counted; the server stays up. Env faults, hangs and the dead-man's
switch behave as in worker inference (rollout/serving.py, rollout/stepping.py).
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator

import grpc
import numpy as np

from hetrl.protos import hetrl_pb2
from hetrl.rollout import wire
from hetrl.rollout.envs import action_dtype, make_vector_env
from hetrl.rollout.errors import WireFormatError
from hetrl.rollout.fragments import stacks_message
from hetrl.rollout.lifetime import exit_now
from hetrl.rollout.observations import Obs
from hetrl.rollout.serving import (
    StreamServer,
    exit_code_of,
    read_requests,
    run_main,
    serve_until_stopped,
    worker_seed,
)
from hetrl.rollout.settings import WorkerSettings
from hetrl.rollout.stacks import stackable
from hetrl.rollout.stepping import EnvStepper, StepResult

log = logging.getLogger("hetrl.worker")


def group_sizes(num_envs: int) -> list[int]:
    """Envs per group: two groups taking turns when there are two envs or more."""
    if num_envs < 2:
        return [num_envs]
    return [num_envs - num_envs // 2, num_envs // 2]


def env_step_message(group: int, step: int, observations: Obs, rewards: np.ndarray,
                     terminated: np.ndarray, truncated: np.ndarray, faulted: np.ndarray,
                     life_lost: np.ndarray | None = None, step_seconds: float = 0.0,
                     previous: np.ndarray | None = None) -> bytes:
    """The serialized WorkerMessage of one group's step (the arrays in `StepResult`'s
    order; a nested space's observations as named leaves; `life_lost` only with
    --episodic-life). Frame stacks travel as their new frames after `previous`, the
    group's observations of the step before, which the learner holds (None at a reset)."""
    obs: dict
    if isinstance(observations, dict):
        obs = {"observation_leaves": wire.encode_named(observations)}
    elif (stacks := stacks_message(observations[None], previous)) is not None:
        obs = {"observation_stacks": stacks}
    else:
        obs = {"observations": wire.encode(observations)}
    if life_lost is not None:
        obs["life_lost"] = wire.encode(np.asarray(life_lost, dtype=bool))
    return hetrl_pb2.WorkerMessage(env_step=hetrl_pb2.EnvStep(
        group=group, step=step, **obs,
        rewards=wire.encode(np.asarray(rewards, dtype=np.float32)),
        terminated=wire.encode(np.asarray(terminated, dtype=bool)),
        truncated=wire.encode(np.asarray(truncated, dtype=bool)),
        faulted=wire.encode(np.asarray(faulted, dtype=bool)),
        step_seconds=step_seconds,
    )).SerializeToString()


def _held(obs: Obs) -> np.ndarray | None:
    """What the learner holds of a group's step for the next one's frame stacks: a copy
    (a vector env may reuse its buffers), and only of observations that may be stacks."""
    if isinstance(obs, np.ndarray) and stackable(obs.shape[1:], obs.dtype):
        return obs.copy()
    return None


class _ActionInbox:
    """What the learner has sent on the current stream: actions in order, stop, close."""

    def __init__(self, limit: int) -> None:
        self.cond = threading.Condition()
        self.actions: collections.deque[hetrl_pb2.Actions] = collections.deque()
        self.limit = limit  # one outstanding EnvStep per group: never more actions than that
        self.stop_reason: str | None = None
        self.malformed: str | None = None
        self.closed = False

    def wait(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(
                lambda: self.closed or self.malformed is not None
                or self.stop_reason is not None or bool(self.actions), timeout)


def _read_requests(requests, inbox: _ActionInbox) -> None:
    """Queue the learner's actions (and its stop) until the stream ends."""

    def take(message: hetrl_pb2.LearnerMessage) -> str | None:
        kind = message.WhichOneof("kind")
        if kind == "actions":
            if len(inbox.actions) >= inbox.limit:
                return f"more than {inbox.limit} Actions outstanding"
            inbox.actions.append(message.actions)
        elif kind == "stop":
            inbox.stop_reason = message.stop.reason or "stop"
        else:
            return (f"{kind} sent to a central-inference worker (it takes actions, not "
                    "weights or credits)")
        return None

    read_requests(requests, inbox, take)


class EnvServer(StreamServer):
    """Owns the env groups; serves one learner stream of env steps at a time."""

    def __init__(self, settings: WorkerSettings) -> None:
        super().__init__(settings)
        self.sizes = group_sizes(settings.envs_per_worker)
        self.groups = [
            EnvStepper(self._make_envs(n), remake=functools.partial(self._make_envs, n),
                       failure_rate=settings.env_failure_rate,
                       failure_window=settings.env_failure_window, nonfinite=settings.nonfinite,
                       episodic_life=settings.episodic_life)
            for n in self.sizes
        ]
        first = self.groups[0].envs
        obs_space, act_space = first.single_observation_space, first.single_action_space
        self.action_shape = tuple(act_space.shape or ())
        self.action_dtype = action_dtype(act_space)
        self.hello = hetrl_pb2.Hello(
            worker_id=settings.worker_id,
            incarnation=uuid.uuid4().hex,
            num_envs=sum(self.sizes),
            fragment_length=settings.fragment_length,
            env=settings.env,
            observation_space=str(obs_space),
            action_space=str(act_space),
            inference="central",
            env_groups=len(self.sizes),
            normalize_rewards=settings.normalize_rewards,
            reward_norm_gamma=settings.reward_norm_gamma,
            reward_clip=settings.reward_clip,
            clip_rewards=settings.clip_rewards,
        )
        # Seeds of the first reset (group g's envs continue the worker's numbering);
        # later streams reset with the envs' own generators.
        seed = worker_seed(settings.seed, settings.worker_id)
        self._seeds: list[int | None] = [seed + sum(self.sizes[:g]) for g in range(len(self.sizes))]
        self.steps_sent = 0
        self.streams_served = 0
        self.ready.set()  # its envs are made; each stream resets them as it starts

    def _make_envs(self, n: int):
        s = self.settings
        return make_vector_env(s, n, s.vector_mode)

    def busy_since(self) -> float | None:
        return next((t for g in self.groups if (t := g.busy_since) is not None), None)

    def receive_limit(self) -> int:
        """The largest LearnerMessage accepted: one group's actions, with room to spare."""
        largest = max(self.sizes) * math.prod(self.action_shape) * self.action_dtype.itemsize
        return int(largest * 1.25) + (64 << 10)

    def _serve(self, requests, context) -> Iterator[bytes]:
        inbox = _ActionInbox(limit=len(self.groups))
        reader = threading.Thread(target=_read_requests, args=(requests, inbox),
                                  name="learner-reader", daemon=True)
        reader.start()
        self.streams_served += 1
        yield hetrl_pb2.WorkerMessage(hello=self.hello).SerializeToString()
        expected = []
        # Each group's observations as the learner holds them: frame stacks after them
        # travel as their new frames (a copy: a vector env may reuse its buffers).
        sent: list[np.ndarray | None] = [None] * len(self.groups)
        for g, stepper in enumerate(self.groups):
            start = time.perf_counter()
            obs = self.guarded(context, lambda s=stepper, g=g: s.reset(seed=self._seeds[g]))
            self._seeds[g] = None
            n = self.sizes[g]
            zeros = np.zeros(n, dtype=bool)
            expected.append(1)
            sent[g] = _held(obs)
            yield env_step_message(g, 0, obs, np.zeros(n, np.float32), zeros, zeros, zeros,
                                   step_seconds=time.perf_counter() - start)
        while True:
            while not inbox.wait(timeout=1.0):
                if not context.is_active() or self.stopped.is_set():
                    return
            with inbox.cond:
                malformed = inbox.malformed
                if malformed is None and inbox.stop_reason is not None:
                    self._stop(f"learner: {inbox.stop_reason}")
                    return
                if malformed is None and not inbox.actions:
                    return  # closed
                message = inbox.actions.popleft() if malformed is None else None
            try:
                if message is None:
                    raise WireFormatError(str(malformed))
                group, actions = self._check_actions(message, expected)
            except WireFormatError as exc:
                self.messages_malformed += 1
                log.error("a request from the learner was refused: %s", exc)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"malformed LearnerMessage: {exc}"[:2000])
            stepper = self.groups[group]
            start = time.perf_counter()
            result: StepResult = self.guarded(context, functools.partial(stepper.step, actions))
            step = expected[group]
            expected[group] += 1
            self.steps_sent += 1
            self.delivered(self.steps_sent)
            reply = env_step_message(group, step, result.observations, result.rewards,
                                     result.terminated, result.truncated, result.faulted,
                                     result.life_lost, time.perf_counter() - start,
                                     previous=sent[group])
            sent[group] = _held(result.observations)
            yield reply

    def _check_actions(self, message: hetrl_pb2.Actions, expected: list[int]
                       ) -> tuple[int, np.ndarray]:
        """The group and the decoded actions of a well-formed Actions message.

        Raises:
            WireFormatError: unknown group, out of turn, wrong shape or dtype, NaN/Inf.
        """
        group = message.group
        if group >= len(self.groups):
            raise WireFormatError(f"actions for group {group}; this worker has "
                                  f"{len(self.groups)}")
        if message.step != expected[group] - 1:
            raise WireFormatError(f"actions for step {message.step} of group {group}, "
                                  f"expected {expected[group] - 1}")
        actions = wire.decode(message.actions)
        shape = (self.sizes[group], *self.action_shape)
        if actions.shape != shape or actions.dtype.newbyteorder("=") != self.action_dtype:
            raise WireFormatError(f"actions {actions.shape} {actions.dtype}, expected "
                                  f"{shape} {self.action_dtype}")
        actions = wire.to_native(actions)
        if actions.dtype.kind == "f" and not np.isfinite(actions).all():
            raise WireFormatError("actions hold NaN or Inf")
        return group, actions

    def close(self) -> None:
        for group in self.groups:
            group.close()


def run_env_server(settings: WorkerSettings) -> int:
    """Serve until stopped; return the process exit code."""
    server = EnvServer(settings)
    code = serve_until_stopped(server, server.receive_limit())
    code = exit_code_of(server, code)
    log.info("env server %d stopped (%s): %d env steps sent over %d streams, %d malformed "
             "requests refused", settings.worker_id, server.stop_reason or "no learner",
             server.steps_sent, server.streams_served, server.messages_malformed)
    return code


def main(argv: list[str] | None = None) -> int:
    """`python -m hetrl.rollout.env_server SETTINGS_JSON`: a worker in central inference."""
    return run_main(argv, run_env_server)


if __name__ == "__main__":
    exit_now(main())
