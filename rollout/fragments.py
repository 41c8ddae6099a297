"""The fragment, defined once, and its trip over the wire with the checks a receiver makes.

`Steps` names the per-step arrays of a fragment, each with its layout ([T+1, N, *obs]
for observations, [T, N, ...] for the rest, and its dtype); a nested observation space's
observations are its leaves ({path: [T+1, N, *leaf]}, see observations.py): data in the
one `observations` field, not new fields; `FragmentArrays` is a whole
fragment as the collector makes it (the steps, the episodes that ended in it, and its
counters), and the learner's `Batch` is the same `Steps` in torch. Everything else is
derived from these two classes: the arrays on the wire (`ARRAY_FIELDS`), its scalars
(`SCALAR_FIELDS`), the shapes a receiver expects (`expected_steps`), the finiteness
check (`nonfinite_fields`) and the learner's batch fields (`STEP_FIELDS`), so a new
field is added here (and to the proto) and nowhere else. The proto's own message is
`hetrl_pb2.Fragment`; what a receiver gets back is a `ReceivedFragment` (the arrays with
who sent them and with which weights).

`serialize` turns `FragmentArrays` into the bytes of a `WorkerMessage`, copying each
array once (the sending hot path; stacked frames travel once per frame, stacks.py);
`to_message` builds the same message the readable way (tests hold the two equal);
`from_message` turns one back and checks every array against the shapes the stream's
Hello announced, so nothing malformed reaches training.
No sockets and no torch here: the rollout side and the learner's decode threads share it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

import numpy as np

from hetrl.protos import hetrl_pb2
from hetrl.rollout import wire
from hetrl.rollout.errors import WireFormatError
from hetrl.rollout.observations import SEPARATOR, Obs, ObsLayout
from hetrl.rollout.stacks import packed, unpack

ArrayT = TypeVar("ArrayT")


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """How one per-step array is shaped: T rows (T + 1 with `extra_row`, or `rows`), N
    envs, then the observation's, the action's or the recurrent state's shape and dtype
    (`like`), or nothing and `dtype`. A `recurrent` array is there only when the policy
    is (None otherwise, and absent from the wire)."""

    dtype: type | None = None
    like: str | None = None  # "observation", "action" or "state": from the learner's own
    extra_row: bool = False
    rows: int = 0
    recurrent: bool = False


def _step(dtype: type | None = None, like: str | None = None, extra_row: bool = False):
    return dataclasses.field(metadata={"step": StepLayout(dtype, like, extra_row)})


def _recurrent(dtype: type | None = None, like: str | None = None, extra_row: bool = False,
               rows: int = 0):
    # keyword-only with a default, so feed-forward code never names these fields
    return dataclasses.field(default=None, kw_only=True, metadata={
        "step": StepLayout(dtype, like, extra_row, rows, recurrent=True)})


def _episodes():
    return dataclasses.field(metadata={"episodes": True})


@dataclasses.dataclass
class Steps(Generic[ArrayT]):
    """The per-step arrays of a fragment (numpy) or of a training batch (torch),
    time-major. The one list of them: the wire, the receiver's checks and the learner's
    batch all follow it."""

    observations: ArrayT = _step(like="observation", extra_row=True)
    """[T+1, N, *obs] (per leaf, {path: [T+1, N, *leaf]}, for a nested space): row t is
    what the policy saw at step t; row T, the observation after the last step, is what
    a cut-off episode bootstraps from."""
    actions: ArrayT = _step(like="action")
    rewards: ArrayT = _step(np.float32)
    terminated: ArrayT = _step(np.bool_)
    truncated: ArrayT = _step(np.bool_)
    logprobs: ArrayT = _step(np.float32)
    """The behaviour policy's log-probability of each action (for the importance ratios)."""
    valid: ArrayT = _step(np.bool_)
    """False on reset steps and on the steps of aborted episodes: never trained on."""
    starts: ArrayT | None = _recurrent(np.bool_, extra_row=True)
    """[T+1, N], recurrent policies only: observation t begins an episode (the first
    after a reset, or after a fault recreated the env), so the hidden state is zero
    before it."""
    initial_state: ArrayT | None = _recurrent(like="state", rows=1)
    """[1, N, S] float32, recurrent policies only: each env's hidden state before step 0,
    so the learner replays the fragment's sequence exactly (zeroed where starts[0])."""


@dataclasses.dataclass
class FragmentArrays(Steps[np.ndarray]):
    """One fragment as a worker collects and sends it: the steps, the episodes that ended
    in it, and its counters."""

    episode_returns: np.ndarray = _episodes()
    """[E] float32: the return of each episode that ended in this fragment."""
    episode_lengths: np.ndarray = _episodes()
    """[E] int64: their lengths in valid steps."""
    collect_seconds: float = 0.0
    """Seconds the worker spent collecting the fragment."""
    env_faults: int = 0
    """Env failures (exceptions or NaN/Inf) in this fragment; each env was recreated."""
    episodes_aborted: int = 0
    """Episodes cut short by a fault; their steps here have valid = 0."""


# Derived from the classes above, never written out again.
STEP_FIELDS = tuple(f.name for f in dataclasses.fields(Steps))
EPISODE_FIELDS = tuple(f.name for f in dataclasses.fields(FragmentArrays)
                       if "episodes" in f.metadata)
ARRAY_FIELDS = STEP_FIELDS + EPISODE_FIELDS
"""The fields that travel as NDArray, in wire order."""
SCALAR_FIELDS = tuple(f.name for f in dataclasses.fields(FragmentArrays)
                      if f.name not in ARRAY_FIELDS)
"""The fields that travel as proto scalars of the same name."""
_LAYOUTS = {f.name: f.metadata["step"] for f in dataclasses.fields(Steps)}


Expected = tuple[tuple[int, ...], np.dtype]


def expected_steps(
    length: int,
    num_envs: int,
    obs_layout: ObsLayout,
    action_shape: tuple[int, ...],
    action_dtype: np.dtype,
    state_size: int = 0,
) -> dict[str, Any]:
    """Shape and dtype of every step array of a fragment of `length` steps of `num_envs`
    (for observations, per leaf of a nested space: `obs_layout.expected`); the recurrent
    arrays are None (must be absent) unless the policy keeps `state_size` numbers per env."""
    out: dict[str, Any] = {}
    for name, layout in _LAYOUTS.items():
        rows = layout.rows or (length + 1 if layout.extra_row else length)
        if layout.recurrent and not state_size:
            out[name] = None
        elif layout.like == "state":
            out[name] = ((rows, num_envs, state_size), np.dtype(np.float32))
        elif layout.like == "observation":
            out[name] = obs_layout.expected(rows, num_envs)
        elif layout.like == "action":
            out[name] = ((rows, num_envs, *action_shape), np.dtype(action_dtype))
        else:
            out[name] = ((rows, num_envs), np.dtype(layout.dtype))
    return out


def flat_steps(steps: Steps) -> dict[str, Any]:
    """Every per-step array of `steps` under one name, a nested space's observation
    leaves as "observations/<path>" (what the learner's batch slots are keyed by)."""
    out = {}
    for name in STEP_FIELDS:
        value = getattr(steps, name)
        if value is None:  # a feed-forward policy's recurrent arrays
            continue
        if isinstance(value, dict):
            out.update({f"{name}{SEPARATOR}{leaf}": array for leaf, array in value.items()})
        else:
            out[name] = value
    return out


def nested_steps(flat: dict[str, Any]) -> dict[str, Any]:
    """`flat_steps` undone: {field: array, or {path: array} of observation leaves}."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        field, _, leaf = key.partition(SEPARATOR)
        if leaf:
            out.setdefault(field, {})[leaf] = value
        else:
            out[key] = value
    return out


@dataclasses.dataclass
class ReceivedFragment:
    """A fragment as the learner received it: the arrays plus who produced it and with
    which weights (the proto's `hetrl_pb2.Fragment` decoded and checked)."""

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


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        bits, n = n & 0x7F, n >> 7
        out.append(bits | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field_header(number: int, size: int) -> bytes:
    """Tag and length of a length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(size)


_FRAGMENT_FIELD = hetrl_pb2.WorkerMessage.DESCRIPTOR.fields_by_name["fragment"].number
_DATA_FIELD = hetrl_pb2.NDArray.DESCRIPTOR.fields_by_name["data"].number
_LEAVES_FIELD = hetrl_pb2.Fragment.DESCRIPTOR.fields_by_name["observation_leaves"].number
_LEAF_ARRAY_FIELD = hetrl_pb2.NamedArray.DESCRIPTOR.fields_by_name["array"].number
_ARRAY_NUMBERS = {name: hetrl_pb2.Fragment.DESCRIPTOR.fields_by_name[name].number
                  for name in ARRAY_FIELDS}
_STACKS_FIELD = hetrl_pb2.Fragment.DESCRIPTOR.fields_by_name["observation_stacks"].number
_STACKS_FIELDS = ("frames", "whole")
_STACKS_NUMBERS = {name: hetrl_pb2.FrameStacks.DESCRIPTOR.fields_by_name[name].number
                   for name in _STACKS_FIELDS}


def _scalars(
    arrays: FragmentArrays, worker_id: int, incarnation: str, sequence: int,
    policy_version: int, wait_seconds: float,
) -> dict:
    """The Fragment's non-array fields, named once for both encoders."""
    return dict(
        worker_id=worker_id, incarnation=incarnation, sequence=sequence,
        policy_version=policy_version, wait_seconds=wait_seconds,
        **{name: getattr(arrays, name) for name in SCALAR_FIELDS},
    )
def serialize(
    arrays: FragmentArrays,
    worker_id: int,
    incarnation: str,
    sequence: int,
    policy_version: int,
    wait_seconds: float = 0.0,
) -> bytes:
    """The serialized WorkerMessage of a fragment, each array's bytes copied once.

    Building the message through protobuf copies a 16 MiB fragment five times (70 ms,
    bench/transport.py); here the small fields go through protobuf and each array is
    written as NDArray{dtype, shape, data} by hand, the data straight from the array's
    buffer, all joined once (under 1 ms). Protobuf accepts fields in any order, so the
    result parses into exactly what `to_message` builds.
    """
    head = hetrl_pb2.Fragment(**_scalars(
        arrays, worker_id, incarnation, sequence, policy_version, wait_seconds
    )).SerializeToString()
    parts: list[bytes | memoryview] = [head]
    for name, number in _ARRAY_NUMBERS.items():
        value = getattr(arrays, name)
        if value is None:  # a feed-forward policy's recurrent arrays: not sent
            continue
        if isinstance(value, dict):  # a nested space's observation leaves
            for leaf, array in value.items():
                label = hetrl_pb2.NamedArray(name=leaf).SerializeToString()
                ndarray = _ndarray_parts(f"{name} {leaf!r}", array)
                inner = sum(len(p) for p in ndarray)
                array_head = _field_header(_LEAF_ARRAY_FIELD, inner)
                parts += [_field_header(_LEAVES_FIELD, len(label) + len(array_head) + inner),
                          label, array_head, *ndarray]
            continue
        stacks = packed(value) if name == "observations" else None
        if stacks is not None:  # frame stacks: each frame once
            stack_parts: list[bytes | memoryview] = []
            for field, array in zip(_STACKS_FIELDS, stacks, strict=True):
                ndarray = _ndarray_parts(f"observation stacks {field}", array)
                stack_parts += [_field_header(_STACKS_NUMBERS[field],
                                              sum(len(p) for p in ndarray)), *ndarray]
            parts += [_field_header(_STACKS_FIELD, sum(len(p) for p in stack_parts)),
                      *stack_parts]
            continue
        ndarray = _ndarray_parts(name, value)
        parts += [_field_header(number, sum(len(p) for p in ndarray)), *ndarray]
    size = sum(len(p) for p in parts)
    return b"".join([_field_header(_FRAGMENT_FIELD, size), *parts])


def _ndarray_parts(name: str, array: np.ndarray) -> list[bytes | memoryview]:
    """An NDArray message's bytes in parts, the data the array's own buffer."""
    array = np.ascontiguousarray(array)
    if array.dtype.kind not in "biufc":
        raise WireFormatError(f"cannot send {name} of dtype {array.dtype}")
    meta = hetrl_pb2.NDArray(dtype=array.dtype.str, shape=array.shape).SerializeToString()
    if not array.nbytes:
        return [meta]
    return [meta, _field_header(_DATA_FIELD, array.nbytes), array.data.cast("B")]


def stacks_message(observations: np.ndarray, previous: np.ndarray | None = None
                   ) -> hetrl_pb2.FrameStacks | None:
    """Observations [T+1, N, ...] as the FrameStacks message they travel as when
    packing them pays (stacks.packed), else None."""
    stacks = packed(observations, previous)
    if stacks is None:
        return None
    return hetrl_pb2.FrameStacks(frames=wire.encode(stacks[0]), whole=wire.encode(stacks[1]))


def to_message(arrays: FragmentArrays, *header: Any, **named: Any) -> hetrl_pb2.WorkerMessage:
    """The message `serialize` encodes (same arguments after `arrays`), built through
    protobuf: the plain reference that tests and benchmarks compare `serialize` with."""
    fields: dict[str, Any] = {}
    for name in ARRAY_FIELDS:
        value = getattr(arrays, name)
        if value is None:
            continue
        if isinstance(value, dict):
            fields["observation_leaves"] = wire.encode_named(value)
        elif name == "observations" and (stacks := stacks_message(value)) is not None:
            fields["observation_stacks"] = stacks
        else:
            fields[name] = wire.encode(value)
    scalars = _scalars(arrays, *header, **named)
    return hetrl_pb2.WorkerMessage(fragment=hetrl_pb2.Fragment(**scalars, **fields))


def decode_observations(
    message: Any, expected: Obs, what: str = "fragment observations",
    previous: np.ndarray | None = None,
) -> Obs:
    """The observations of a Fragment or EnvStep message (`observations`, frame stacks
    rebuilt from `observation_stacks`, or a nested space's `observation_leaves`), each
    array checked against `expected` (shape and dtype, a tree of them) and in native
    byte order. `previous`: an EnvStep's stacks are rebuilt after it (the observations
    of the group's step before).

    Raises:
        WireFormatError: a leaf missing, unknown or repeated, or of the wrong dtype or shape.
    """
    if not isinstance(expected, dict):
        if message.observation_leaves:
            raise WireFormatError(f"{what}: observation leaves where a Box was expected")
        if _has(message, "observation_stacks"):
            if message.HasField("observations"):
                raise WireFormatError(f"{what}: both plain observations and frame stacks")
            stacks = message.observation_stacks
            if expected[1] != np.uint8:
                raise WireFormatError(f"{what}: frame stacks where {expected[1]} was expected")
            one_step = isinstance(message, hetrl_pb2.EnvStep)  # one row, [n, ...]
            shape = (1, *expected[0]) if one_step else expected[0]
            rebuilt = unpack(wire.to_native(wire.decode(stacks.frames)),
                             wire.to_native(wire.decode(stacks.whole)), shape,
                             previous if one_step else None)
            return rebuilt[0] if one_step else rebuilt
        return checked(wire.decode(message.observations), expected, what)
    if message.HasField("observations") or _has(message, "observation_stacks"):
        raise WireFormatError(f"{what}: one array where leaves {sorted(expected)} were expected")
    decoded = wire.decode_named(message.observation_leaves)
    if set(decoded) != set(expected):
        raise WireFormatError(f"{what}: leaves {sorted(decoded)}, expected {sorted(expected)}")
    return {leaf: checked(decoded[leaf], expected[leaf], f"{what} {leaf!r}")
            for leaf in expected}


def _has(message: Any, field: str) -> bool:
    """Whether `message` (a Fragment or an EnvStep) has this field and it is set."""
    return field in message.DESCRIPTOR.fields_by_name and message.HasField(field)


def checked(array: np.ndarray, expected: Expected, what: str) -> np.ndarray:
    """`array` in native byte order, if it has the expected shape and dtype.

    Raises:
        WireFormatError: it has not.
    """
    shape, dtype = expected
    if array.shape != shape or array.dtype.newbyteorder("=") != dtype.newbyteorder("="):
        raise WireFormatError(f"{what}: got {array.shape} {array.dtype}, expected {shape} {dtype}")
    return wire.to_native(array)


def from_message(message: hetrl_pb2.Fragment, expected: dict[str, Any]) -> ReceivedFragment:
    """Decode and check a fragment against the shapes announced for its stream
    (`expected`: what `expected_steps` makes of its Hello).

    Raises:
        WireFormatError: any array is malformed or has the wrong dtype or shape.
    """
    decoded: dict[str, Any] = {
        "observations": decode_observations(message, expected["observations"])}
    for name in ARRAY_FIELDS:
        if name == "observations":
            continue
        if name in expected and expected[name] is None:  # recurrent arrays, not expected
            if message.HasField(name):
                raise WireFormatError(f"fragment {name} from a recurrent policy; this "
                                      "learner's policy is feed-forward (--recurrent)")
            decoded[name] = None
            continue
        if name in expected and not message.HasField(name):
            raise WireFormatError(f"fragment without {name}: is the worker's policy "
                                  "feed-forward? This learner's is recurrent (--recurrent)")
        array = wire.decode(getattr(message, name))
        decoded[name] = (checked(array, expected[name], f"fragment {name}")
                         if name in expected else array)
    n_episodes = decoded[EPISODE_FIELDS[0]].shape
    if len(n_episodes) != 1 or any(decoded[name].shape != n_episodes
                                   for name in EPISODE_FIELDS):
        raise WireFormatError(f"fragment {' and '.join(EPISODE_FIELDS)} differ in shape")
    # Any: arrays and scalars, matched to FragmentArrays' fields by name.
    values: dict[str, Any] = {**decoded,
                              **{name: getattr(message, name) for name in SCALAR_FIELDS}}
    return ReceivedFragment(
        worker_id=message.worker_id,
        incarnation=message.incarnation,
        sequence=message.sequence,
        policy_version=message.policy_version,
        arrays=FragmentArrays(**values),
        wait_seconds=message.wait_seconds,
    )


def nonfinite_fields(arrays: FragmentArrays) -> list[str]:
    """Names of the float arrays of a fragment that hold NaN or Inf (empty: all finite;
    a nested space's observation leaves named "observations/<path>")."""
    named = {**flat_steps(arrays), **{name: getattr(arrays, name) for name in EPISODE_FIELDS}}
    return [name for name, array in named.items()
            if array.dtype.kind in "fc" and not np.isfinite(array).all()]
