"""Convert numpy arrays to and from the wire's `NDArray` (dtype string, shape, raw bytes).

Every array a peer sends is decoded here; arrays are encoded here too, except on the
fragment's hot path, where `fragments.serialize` writes the same NDArray bytes by hand
(tests/rollout/test_wire.py holds the two equal). Decoding trusts nothing: the
dtype must be a plain numeric or boolean type (no object, void or string dtypes, so
no code can hide in an array), dims must be non-negative and bounded, and the byte
count must match. It never pickles and never executes anything it receives.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import numpy as np

from hetrl.protos import hetrl_pb2
from hetrl.rollout.errors import WireFormatError

# Kinds numpy may decode from a peer: bool, signed, unsigned, float, complex.
_ALLOWED_KINDS = frozenset("biufc")
_DTYPE_PATTERN = re.compile(r"[<>|][biufc][0-9]{1,2}")
_MAX_DIMS = 32
_MAX_ELEMENTS = 1 << 40


def encode(array: np.ndarray) -> hetrl_pb2.NDArray:
    """Encode an array; non-contiguous arrays are copied to C order, byte order is kept."""
    array = np.asarray(array)
    if array.dtype.kind not in _ALLOWED_KINDS:
        raise WireFormatError(
            f"cannot send dtype {array.dtype}: only bool and numeric arrays go on the wire"
        )
    return hetrl_pb2.NDArray(dtype=array.dtype.str, shape=array.shape, data=array.tobytes())


def decode(message: hetrl_pb2.NDArray) -> np.ndarray:
    """Decode an NDArray into a read-only array that views the message's bytes.

    Raises:
        WireFormatError: unknown or unsafe dtype, bad shape, or a byte count that does
            not match dtype and shape.
    """
    # Check the string before numpy parses it: only "<f4"-style codes get that far.
    if not _DTYPE_PATTERN.fullmatch(message.dtype):
        raise WireFormatError(f"dtype {message.dtype!r} is not allowed on the wire")
    try:
        dtype = np.dtype(message.dtype)
    except TypeError as exc:
        raise WireFormatError(f"unknown dtype {message.dtype!r}") from exc
    if dtype.str != message.dtype:
        raise WireFormatError(f"dtype {message.dtype!r} is not in canonical form")
    shape = tuple(message.shape)
    if len(shape) > _MAX_DIMS or any(d < 0 for d in shape):
        raise WireFormatError(f"bad shape {shape}")
    # Bound the extent ignoring zero dims too: numpy refuses an empty array whose other
    # dims overflow its size arithmetic, so (0, 2**40, 2**40) is malformed, not empty.
    count, extent = 1, 1
    for dim in shape:
        count *= dim
        extent *= max(dim, 1)
        if extent > _MAX_ELEMENTS:
            raise WireFormatError(f"shape {shape} is too large")
    if count * dtype.itemsize != len(message.data):
        raise WireFormatError(
            f"shape {shape} of {message.dtype} needs {count * dtype.itemsize} bytes, "
            f"got {len(message.data)}"
        )
    return np.frombuffer(message.data, dtype=dtype).reshape(shape)


def to_native(array: np.ndarray) -> np.ndarray:
    """Return the array in native byte order (torch cannot read swapped arrays)."""
    if array.dtype.byteorder in ("=", "|") or array.dtype.isnative:
        return array
    return array.astype(array.dtype.newbyteorder("="))


def encode_named(arrays: Mapping[str, np.ndarray]) -> list[hetrl_pb2.NamedArray]:
    """Encode a name -> array mapping (model weights) as a list of NamedArray."""
    return [hetrl_pb2.NamedArray(name=name, array=encode(a)) for name, a in arrays.items()]


def decode_named(items: Iterable[hetrl_pb2.NamedArray]) -> dict[str, np.ndarray]:
    """Decode NamedArrays; a repeated name is an error, not a silent overwrite."""
    out: dict[str, np.ndarray] = {}
    for item in items:
        if item.name in out:
            raise WireFormatError(f"array {item.name!r} appears twice")
        out[item.name] = decode(item.array)
    return out
