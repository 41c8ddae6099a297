"""The fragment's one definition (rollout.fragments) against the proto, and what is derived
from it: the shapes a receiver expects, the round trip, the finiteness check."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from hetrl.protos import hetrl_pb2
from hetrl.rollout.errors import WireFormatError
from hetrl.rollout.fragments import (
    ARRAY_FIELDS,
    SCALAR_FIELDS,
    STEP_FIELDS,
    FragmentArrays,
    expected_steps,
    from_message,
    nonfinite_fields,
    serialize,
)
from hetrl.rollout.observations import ObsLayout

T, N, OBS, ACT = 4, 3, (2, 5), (2,)
STATE = 6  # a recurrent policy's state per env: every field is exercised
# The fragment's fields the definition does not carry: who sent it, with which weights.
ORIGIN = {"worker_id", "incarnation", "sequence", "policy_version", "wait_seconds"}


def make_arrays(seed: int = 0) -> FragmentArrays:
    rng = np.random.default_rng(seed)
    layout = expected_steps(T, N, ObsLayout.box(OBS, np.float32), ACT, np.float32, STATE)
    steps = {name: (rng.random(shape) < 0.5 if dtype.kind == "b" else
                    rng.standard_normal(shape).astype(dtype))
             for name, (shape, dtype) in layout.items()}
    return FragmentArrays(**steps, episode_returns=np.array([1.5, 2.5], np.float32),
                          episode_lengths=np.array([3, 4], np.int64), collect_seconds=0.25,
                          env_faults=1, episodes_aborted=2)


def decode(raw: bytes):
    message = hetrl_pb2.WorkerMessage.FromString(raw).fragment
    return from_message(message, expected_steps(T, N, ObsLayout.box(OBS, np.float32), ACT,
                                                np.float32, STATE))


def test_the_definition_is_the_proto_s_fragment() -> None:
    fields = hetrl_pb2.Fragment.DESCRIPTOR.fields
    arrays = {f.name for f in fields if f.message_type is hetrl_pb2.NDArray.DESCRIPTOR}
    assert set(ARRAY_FIELDS) == arrays, "add the field to protos/hetrl.proto as NDArray too"
    # A nested space's observations travel as named leaves in observation_leaves, stacked
    # frames as their new frames in observation_stacks.
    scalars = ({f.name for f in fields} - arrays - ORIGIN
               - {"observation_leaves", "observation_stacks"})
    assert set(SCALAR_FIELDS) == scalars, "add the field to protos/hetrl.proto too"


def test_expected_steps_reads_the_layout_of_each_field() -> None:
    layout = expected_steps(T, N, ObsLayout.box(OBS, np.uint8), ACT, np.int64)
    assert tuple(layout) == STEP_FIELDS
    assert layout == {
        "observations": ((T + 1, N, *OBS), np.dtype(np.uint8)),
        "actions": ((T, N, *ACT), np.dtype(np.int64)),
        "rewards": ((T, N), np.dtype(np.float32)),
        "terminated": ((T, N), np.dtype(bool)),
        "truncated": ((T, N), np.dtype(bool)),
        "logprobs": ((T, N), np.dtype(np.float32)),
        "valid": ((T, N), np.dtype(bool)),
        "starts": None,  # a feed-forward policy's fragments have no recurrent arrays
        "initial_state": None,
    }
    recurrent = expected_steps(T, N, ObsLayout.box(OBS, np.uint8), ACT, np.int64, STATE)
    assert recurrent["starts"] == ((T + 1, N), np.dtype(bool))
    assert recurrent["initial_state"] == ((1, N, STATE), np.dtype(np.float32))


def test_a_fragment_survives_the_round_trip() -> None:
    arrays = make_arrays()
    received = decode(serialize(arrays, 7, "abc", 11, 3, wait_seconds=0.5))
    assert (received.worker_id, received.incarnation, received.sequence,
            received.policy_version, received.wait_seconds) == (7, "abc", 11, 3, 0.5)
    for field in dataclasses.fields(FragmentArrays):
        np.testing.assert_array_equal(getattr(received.arrays, field.name),
                                      getattr(arrays, field.name), err_msg=field.name)
    assert received.steps == T * N


@pytest.mark.parametrize("name", STEP_FIELDS)
def test_every_step_field_is_checked(name: str) -> None:
    arrays = make_arrays()
    setattr(arrays, name, getattr(arrays, name)[:-1])  # one row short
    with pytest.raises(WireFormatError, match=f"fragment {name}: got"):
        decode(serialize(arrays, 0, "i", 0, 0))


@pytest.mark.parametrize("name", [n for n in ARRAY_FIELDS
                                  if getattr(make_arrays(), n).dtype.kind == "f"])
def test_every_float_field_is_checked_for_nan(name: str) -> None:
    arrays = make_arrays()
    assert nonfinite_fields(arrays) == []
    getattr(arrays, name).flat[0] = np.nan
    assert nonfinite_fields(decode(serialize(arrays, 0, "i", 0, 0)).arrays) == [name]


def test_the_definition_needs_no_torch() -> None:
    code = ("import sys, hetrl.rollout.fragments; "
            "assert 'torch' not in sys.modules and 'gymnasium' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
