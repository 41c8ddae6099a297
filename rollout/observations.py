"""Observations of any space hetrl trains on: one array, or named leaves.

A Box observation is one array. A Dict or Tuple observation (nested to any depth) is its
leaves, each a Box (any dtype and rank), Discrete, MultiDiscrete or MultiBinary, kept
under its path: "image", "robot/joints", "0" (a Tuple's first part). `ObsLayout.of`
reads a space into its leaves once; everything that stores, sends, checks or normalises
observations goes through the layout and `tree_map`, which take a Box's array as the
one-leaf case, so Box runs and nested runs share one code path and a Box run's arrays
are exactly what they were. No torch here (`tree_map` works on numpy arrays and torch
tensors alike), and gymnasium only where a space is read, so that the fragment's
definition, which uses the layout, stays free of both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from hetrl.rollout.errors import EnvError

if TYPE_CHECKING:
    import gymnasium as gym

T = TypeVar("T")
Obs = Any
"""A Box's array (numpy or torch), or a nested space's leaves as {path: array}."""

SEPARATOR = "/"

# How the built-in policy encodes a leaf.
VECTOR, IMAGE, ONE_HOT, BINARY = "vector", "image", "one_hot", "binary"


def tree_map(fn: Callable[..., T], *trees: Obs) -> Obs:
    """`fn` applied leaf by leaf to trees of one layout (a bare array is one leaf)."""
    if isinstance(trees[0], Mapping):
        return {name: fn(*(tree[name] for tree in trees)) for name in trees[0]}
    return fn(*trees)


def leaves(tree: Obs) -> list:
    """A tree's arrays, in layout order."""
    return list(tree.values()) if isinstance(tree, Mapping) else [tree]


def batch_size(tree: Obs) -> int:
    """The length of a tree's first axis (every leaf has the same)."""
    return len(leaves(tree)[0])


def concatenate(trees: Sequence[Obs]) -> Obs:
    """Trees joined along their first axis, leaf by leaf."""
    return tree_map(lambda *parts: np.concatenate(parts), *trees)


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One observation leaf: its path, one observation's shape and dtype, and how the
    built-in policy encodes it."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    encoding: str
    sizes: tuple[int, ...] = ()
    """One-hot leaves: how many values each choice takes."""
    start: tuple[int, ...] = ()
    """One-hot leaves: each choice's smallest value."""

    @property
    def normalized(self) -> bool:
        """Whether the running mean/std applies (vectors; images are scaled to [0, 1],
        choices one-hot encoded)."""
        return self.encoding == VECTOR

    @property
    def width(self) -> int:
        """Numbers this leaf gives a policy's input once encoded (images: pixels)."""
        if self.encoding == ONE_HOT:
            return int(sum(self.sizes))
        return int(np.prod(self.shape))


def is_image(shape: tuple[int, ...] | None, dtype: Any) -> bool:
    """Whether an array of this shape and dtype is pixels: uint8 (H, W), (H, W, C) or
    (C, H, W), which the built-in networks read with a CNN."""
    return np.dtype(dtype) == np.uint8 and len(shape or ()) in (2, 3)


def _leaf(name: str, space: gym.Space, env: str) -> Leaf:
    import gymnasium as gym

    where = f"{env}: observation leaf {name!r} ({space})"
    if isinstance(space, gym.spaces.Box):
        dtype = np.dtype(space.dtype)
        if dtype.kind not in "biuf":
            raise EnvError(f"{where}: dtype {dtype} is not numeric")
        return Leaf(name, tuple(space.shape), dtype,
                    IMAGE if is_image(space.shape, dtype) else VECTOR)
    if isinstance(space, gym.spaces.Discrete):
        return Leaf(name, (), np.dtype(np.int64), ONE_HOT, (int(space.n),), (int(space.start),))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return Leaf(name, tuple(space.shape), np.dtype(space.dtype), ONE_HOT,
                    tuple(int(n) for n in space.nvec.reshape(-1)),
                    tuple(int(s) for s in space.start.reshape(-1)))
    if isinstance(space, gym.spaces.MultiBinary):
        return Leaf(name, tuple(space.shape), np.dtype(space.dtype), BINARY)
    top = name.split(SEPARATOR)[0]
    drop = (f"drop it with --drop-observations {top}, or turn it into numbers with a "
            "gymnasium.ObservationWrapper")
    if isinstance(space, gym.spaces.Text):
        raise EnvError(f"{where}: text cannot be fed to a policy as it is; {drop}")
    raise EnvError(f"{where}: hetrl takes Box, Discrete, MultiDiscrete and MultiBinary "
                   f"leaves; {drop}")


def _walk(space: gym.Space, path: str, env: str) -> list[Leaf]:
    import gymnasium as gym

    if isinstance(space, gym.spaces.Dict):
        parts = list(space.spaces.items())
    elif isinstance(space, gym.spaces.Tuple):
        parts = [(str(i), s) for i, s in enumerate(space.spaces)]
    else:
        return [_leaf(path, space, env)]
    if not parts:
        raise EnvError(f"{env}: observation space {space} has no leaves")
    found: list[Leaf] = []
    for key, sub in parts:
        if SEPARATOR in str(key):
            raise EnvError(f"{env}: observation key {key!r} holds {SEPARATOR!r}, which hetrl "
                           "uses to name nested leaves; rename it")
        found += _walk(sub, f"{path}{SEPARATOR}{key}" if path else str(key), env)
    return found


@dataclasses.dataclass(frozen=True)
class ObsLayout:
    """The leaves of an observation space (one for a Box), in the space's order."""

    leaves: tuple[Leaf, ...]
    nested: bool
    """A Dict or Tuple space: observations are {path: array}; else one array."""

    @classmethod
    def of(cls, space: gym.Space, env: str = "env") -> ObsLayout:
        """The layout of `space`.

        Raises:
            EnvError: a leaf hetrl cannot feed a policy (Text, Graph, Sequence, a
                non-numeric Box), named with what to do.
        """
        import gymnasium as gym

        if isinstance(space, gym.spaces.Box):
            dtype = np.dtype(space.dtype) if space.dtype is not None else None
            if dtype is None or dtype.kind not in "biuf":
                raise EnvError(f"{env}: observation dtype {space.dtype} is not numeric")
            return cls.box(tuple(space.shape), dtype)
        if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            return cls(tuple(_walk(space, "", env)), nested=True)
        raise EnvError(
            f"{env}: observation space {space} is not supported: hetrl takes a Box, or a "
            "Dict or Tuple of Box, Discrete, MultiDiscrete and MultiBinary leaves; wrap "
            "the env (a gymnasium.ObservationWrapper) to give it one of those")

    @classmethod
    def box(cls, shape: tuple[int, ...], dtype: Any) -> ObsLayout:
        """The layout of a Box of this shape and dtype."""
        return cls((Leaf("", tuple(shape), np.dtype(dtype), VECTOR),), nested=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(leaf.name for leaf in self.leaves)

    def flatten(self, obs: Any) -> Obs:
        """An observation (or a batch of them) as gymnasium gives it, as this layout's
        tree: the array of a Box, or {path: array} of a nested space's leaves."""
        if not self.nested:
            return obs
        out: dict[str, np.ndarray] = {}
        _flatten_into(out, obs, "")
        if out.keys() != set(self.names):
            return out  # for `mismatch` to name what differs
        return {name: out[name] for name in self.names}  # the space's order, not the env's

    def unflatten(self, tree: Obs) -> Any:
        """The nested dicts (Dict) and tuples (Tuple) of `tree`'s leaves, as the env
        gave them; a Box's array as it is."""
        if not self.nested:
            return tree
        nested: dict = {}
        for name in self.names:
            *parents, last = name.split(SEPARATOR)
            node = nested
            for key in parents:
                node = node.setdefault(key, {})
            node[last] = tree[name]
        return nested

    def empty(self, *prefix: int) -> Obs:
        """Uninitialised storage for `prefix` observations (e.g. [T + 1, N])."""
        return self.tree(lambda leaf: np.empty((*prefix, *leaf.shape), dtype=leaf.dtype))

    def tree(self, fn: Callable[[Leaf], T]) -> Obs:
        """`fn(leaf)` for every leaf, as a tree of this layout."""
        if not self.nested:
            return fn(self.leaves[0])
        return {leaf.name: fn(leaf) for leaf in self.leaves}

    def expected(self, *prefix: int) -> Obs:
        """(shape, dtype) of every leaf of `prefix` observations, as a tree."""
        return self.tree(lambda leaf: ((*prefix, *leaf.shape), leaf.dtype))

    @property
    def nbytes(self) -> int:
        """Bytes of one observation."""
        return sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in self.leaves)

    def mismatch(self, tree: Obs, *prefix: int) -> str | None:
        """What in `tree` (this layout's tree of `prefix` observations) differs from
        the layout in names or shapes, or None."""
        if self.nested:
            if not isinstance(tree, Mapping) or set(tree) != set(self.names):
                got = sorted(tree) if isinstance(tree, Mapping) else type(tree).__name__
                return f"with leaves {got}, where the space has {sorted(self.names)}"
        for leaf in self.leaves:
            shape = np.shape(tree[leaf.name] if self.nested else tree)
            if shape != (*prefix, *leaf.shape):
                where = f"leaf {leaf.name!r} " if self.nested else ""
                return f"{where}of shape {shape}, where it has shape {(*prefix, *leaf.shape)}"
        return None

    def sample(self, space: gym.Space, count: int) -> Obs:
        """`count` observations sampled from `space` (this layout's), stacked as a tree."""
        samples = [self.flatten(space.sample()) for _ in range(count)]
        return tree_map(lambda *parts: np.stack(parts).astype(parts[0].dtype), *samples) \
            if self.nested else np.stack(samples)


def _flatten_into(out: dict[str, np.ndarray], obs: Any, path: str) -> None:
    items: Iterable[tuple[Any, Any]]
    if isinstance(obs, Mapping):
        items = obs.items()
    elif isinstance(obs, tuple):
        items = ((str(i), part) for i, part in enumerate(obs))
    else:
        out[path] = np.asarray(obs)
        return
    for key, part in items:
        _flatten_into(out, part, f"{path}{SEPARATOR}{key}" if path else str(key))


def all_finite(tree: Obs) -> bool:
    """Whether every float leaf of a tree is free of NaN and Inf."""
    return all(np.asarray(a).dtype.kind not in "fc" or bool(np.isfinite(a).all())
               for a in leaves(tree))


def finite_rows(tree: Obs, n: int) -> np.ndarray:
    """[n] bool: which of `n` observations hold no NaN or Inf in any leaf."""
    good = np.ones(n, dtype=bool)
    for array in leaves(tree):
        if array.dtype.kind in "fc":
            good &= np.isfinite(array.reshape(n, -1)).all(axis=1)
    return good
