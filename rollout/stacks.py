"""Stacked frames on the wire once per frame, rebuilt bit for bit by the receiver.

An observation of K stacked frames ([K, H, W] uint8, Atari's 4 x 84 x 84) repeats K - 1
of its frames from the step before. A fragment's observations [T+1, N, K, H, W] are sent
as the frames that are new: a row that is the row above shifted by one frame travels as
its newest frame only; any other row (the first, one after a reset or an env's
recreation, or an env whose stack is no shift at all) travels whole, its K frames. The
sender tests the shift on the data itself, so nothing depends on how the env stacks and
the rebuilt array equals the sent one exactly (SEED RL rebuilds stacks on the learner
the same way). Central inference's env steps travel the same way, one row each after
the row the learner already holds. No torch, no sockets.
"""

from __future__ import annotations

import numpy as np

from hetrl.rollout.errors import WireFormatError

WORTH_IT = 0.75
"""Packed stacks travel only when they are at most this share of the plain bytes."""


def stackable(shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether observations of this shape (one env's) may be frame stacks: uint8
    [K, H, W] with 2 <= K and frames larger than the stack."""
    return (np.dtype(dtype) == np.uint8 and len(shape) == 3 and 2 <= shape[0] < shape[1]
            and shape[0] < shape[2])


def packed(observations: np.ndarray, previous: np.ndarray | None = None
           ) -> tuple[np.ndarray, np.ndarray] | None:
    """`pack(observations, previous)` when they may be frame stacks and packing saves
    enough (`WORTH_IT`), else None: they travel as they are."""
    if not stackable(observations.shape[2:], observations.dtype):
        return None
    frames, whole = pack(observations, previous)
    return (frames, whole) if frames.nbytes <= WORTH_IT * observations.nbytes else None


def pack(observations: np.ndarray, previous: np.ndarray | None = None
         ) -> tuple[np.ndarray, np.ndarray]:
    """(frames [F, H, W], whole [T+1, N] bool) of observations [T+1, N, K, H, W]: row
    (t, n)'s K frames where `whole`, else its newest frame, rows in (t, n) order.
    `previous` [N, K, H, W]: the row before the first, which the receiver holds (an env
    step after the one it has); None: the first row travels whole."""
    rows, n, k = observations.shape[:3]
    whole = np.ones((rows, n), dtype=bool)
    words = _words(np.ascontiguousarray(observations).reshape(rows, n, k, -1))
    before = (None if previous is None
              else _words(np.ascontiguousarray(previous).reshape(n, k, -1)))
    for t in range(rows):  # a row at a time: the comparison stays in cache
        if before is not None:
            same = words[t, :, :-1] == before[:, 1:]
            whole[t] = ~same.reshape(n, -1).all(axis=1)
        before = words[t]
    flat_whole = whole.reshape(-1)
    counts = np.where(flat_whole, k, 1)
    first = np.arange(rows * n) * k + np.where(flat_whole, 0, k - 1)
    starts = np.cumsum(counts) - counts
    index = np.repeat(first - starts, counts) + np.arange(int(counts.sum()))
    frames = observations.reshape(rows * n * k, *observations.shape[3:])[index]
    return frames, whole


def _words(frames: np.ndarray) -> np.ndarray:
    """[..., bytes] uint8 seen as 8-byte words where the size allows (8x fewer compares)."""
    return frames.view(np.uint64) if frames.shape[-1] % 8 == 0 else frames


def unpack(frames: np.ndarray, whole: np.ndarray, shape: tuple[int, ...],
           previous: np.ndarray | None = None) -> np.ndarray:
    """The observations [T+1, N, K, H, W] (`shape`) that `pack` gave `frames`, `whole`
    (after `previous`, as `pack` was given it).

    Raises:
        WireFormatError: the parts do not fit `shape` (counts, frame shape, dtype, a
            first row that is not whole with no `previous`).
    """
    rows, n, k = shape[:3]
    frame_shape = tuple(shape[3:])
    if whole.shape != (rows, n) or whole.dtype != np.bool_:
        raise WireFormatError(f"frame stacks: mask {whole.shape} {whole.dtype}, expected "
                              f"{(rows, n)} bool")
    if previous is None and not whole[0].all():
        raise WireFormatError("frame stacks: the first row must travel whole")
    counts = np.where(whole.reshape(-1), k, 1)
    if frames.shape != (int(counts.sum()), *frame_shape) or frames.dtype != np.uint8:
        raise WireFormatError(f"frame stacks: frames {frames.shape} {frames.dtype}, expected "
                              f"{(int(counts.sum()), *frame_shape)} uint8")
    starts = (np.cumsum(counts) - counts).reshape(rows, n)
    out = np.empty(shape, dtype=np.uint8)
    span = np.arange(k)
    for t in range(rows):
        full, shifted = whole[t], ~whole[t]
        if full.any():
            out[t, full] = frames[starts[t, full, None] + span]
        if shifted.any():
            before = out[t - 1] if t else previous
            assert before is not None  # checked above
            out[t, shifted, :-1] = before[shifted, 1:]
            out[t, shifted, -1] = frames[starts[t, shifted]]
    return out
