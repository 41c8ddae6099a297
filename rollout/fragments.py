"""Fragment <-> wire message, with the checks a receiver must make.

`to_message` turns a collector's `FragmentArrays` into a `WorkerMessage`;
`from_message` turns one back and checks that every array has the dtype and the
[T(+1), N, ...] shape the stream's Hello announced, so nothing malformed reaches
training; `nonfinite_fields` names the arrays holding NaN/Inf. Pure functions: no
sockets, no torch.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from protos import hetrl_pb2
from rollout import wire
from rollout.collector import ARRAY_FIELDS, FragmentArrays
from rollout.errors import WireFormatError

_STEP_FIELDS = ("actions", "rewards", "terminated", "truncated", "logprobs", "valid")


@dataclasses.dataclass
class Fragment:
    """A received fragment: the arrays plus who produced it and with which weights."""

    worker_id: int
    incarnation: str
    sequence: int
    policy_version: int
    arrays: FragmentArrays
    wait_seconds: float = 0.0

    @property
    def steps(self) -> int:
        """Env steps in the fragment, reset steps included (T x N)."""
        return int(self.arrays.rewards.size)


def to_message(
    arrays: FragmentArrays,
    worker_id: int,
    incarnation: str,
    sequence: int,
    policy_version: int,
    wait_seconds: float = 0.0,
) -> hetrl_pb2.WorkerMessage:
    """Encode a fragment for the wire."""
    fields = {name: wire.encode(getattr(arrays, name)) for name in ARRAY_FIELDS}
    return hetrl_pb2.WorkerMessage(
        fragment=hetrl_pb2.Fragment(
            worker_id=worker_id,
            incarnation=incarnation,
            sequence=sequence,
            policy_version=policy_version,
            collect_seconds=arrays.collect_seconds,
            wait_seconds=wait_seconds,
            env_faults=arrays.env_faults,
            episodes_aborted=arrays.episodes_aborted,
            **fields,
        )
    )


def from_message(
    message: hetrl_pb2.Fragment,
    length: int,
    num_envs: int,
    obs_shape: tuple[int, ...],
    obs_dtype: np.dtype,
    action_shape: tuple[int, ...],
    action_dtype: np.dtype,
) -> Fragment:
    """Decode and check a fragment against the shapes announced for its stream.

    Raises:
        WireFormatError: any array is malformed or has the wrong dtype or shape.
    """
    decoded = {name: wire.decode(getattr(message, name)) for name in ARRAY_FIELDS}
    expected = {
        "observations": ((length + 1, num_envs, *obs_shape), np.dtype(obs_dtype)),
        "actions": ((length, num_envs, *action_shape), np.dtype(action_dtype)),
        "rewards": ((length, num_envs), np.dtype(np.float32)),
        "terminated": ((length, num_envs), np.dtype(bool)),
        "truncated": ((length, num_envs), np.dtype(bool)),
        "logprobs": ((length, num_envs), np.dtype(np.float32)),
        "valid": ((length, num_envs), np.dtype(bool)),
    }
    for name, (shape, dtype) in expected.items():
        array = decoded[name]
        if array.shape != shape or array.dtype.newbyteorder("=") != dtype.newbyteorder("="):
            raise WireFormatError(
                f"fragment {name}: got {array.shape} {array.dtype}, expected {shape} {dtype}"
            )
        decoded[name] = wire.to_native(array)
    n_episodes = decoded["episode_returns"].shape
    if len(n_episodes) != 1 or decoded["episode_lengths"].shape != n_episodes:
        raise WireFormatError("fragment episode_returns and episode_lengths differ in shape")
    return Fragment(
        worker_id=message.worker_id,
        incarnation=message.incarnation,
        sequence=message.sequence,
        policy_version=message.policy_version,
        arrays=FragmentArrays(collect_seconds=message.collect_seconds,
                              env_faults=message.env_faults,
                              episodes_aborted=message.episodes_aborted, **decoded),
        wait_seconds=message.wait_seconds,
    )


def nonfinite_fields(arrays: FragmentArrays) -> list[str]:
    """Names of the float arrays of a fragment that hold NaN or Inf (empty: all finite)."""
    bad = []
    for name in ("observations", "rewards", "logprobs", "actions", "episode_returns"):
        array = getattr(arrays, name)
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            bad.append(name)
    return bad
