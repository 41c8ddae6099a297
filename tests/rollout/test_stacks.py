"""Stacked frames travel once per frame and come back bit for bit (rollout/stacks.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrl.protos import hetrl_pb2
from hetrl.rollout.collector import Collector
from hetrl.rollout.envs import make_vector_env
from hetrl.rollout.errors import WireFormatError
from hetrl.rollout.fragments import expected_steps, from_message, serialize, to_message
from hetrl.rollout.observations import ObsLayout
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import EnvSettings, PolicySettings
from hetrl.rollout.stacks import pack, packed, stackable, unpack


def _stacks(rng: np.random.Generator, rows: int, n: int, k: int, side: int,
            resets: list[tuple[int, int]]) -> np.ndarray:
    """[rows, n, k, side, side]: each env's stream of frames stacked k at a time, a
    fresh stack (a reset) at each (t, env) of `resets`."""
    frames = rng.integers(0, 256, (rows + k, n, side, side), dtype=np.uint8)
    obs = np.stack([frames[t:t + k].swapaxes(0, 1) for t in range(rows)])
    for t, env in resets:
        obs[t, env] = rng.integers(0, 256, (k, side, side), dtype=np.uint8)
    return obs


def test_a_stream_of_stacks_packs_to_its_new_frames_and_back() -> None:
    rng = np.random.default_rng(0)
    obs = _stacks(rng, 65, 3, 4, 12, resets=[(10, 1), (40, 2)])
    frames, whole = pack(obs)
    # whole: the first row, and each reset and the row after it (no shift of a fresh stack)
    assert whole[0].all() and whole.sum() == 3 + 2 + 2
    assert len(frames) == 4 * whole.sum() + (~whole).sum()
    np.testing.assert_array_equal(unpack(frames, whole, obs.shape), obs)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), n=st.integers(1, 4), k=st.integers(2, 4),
       seed=st.integers(0, 2**32 - 1), shifted=st.floats(0, 1))
def test_any_mix_of_shifted_and_fresh_stacks_comes_back_bit_for_bit(
        rows: int, n: int, k: int, seed: int, shifted: float) -> None:
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 3, (rows, n, k, 6, 7), dtype=np.uint8)  # few values: chance repeats
    for t in range(1, rows):
        for env in range(n):
            if rng.random() < shifted:
                obs[t, env, :-1] = obs[t - 1, env, 1:]
    frames, whole = pack(obs)
    back = unpack(frames, whole, obs.shape)
    assert back.dtype == np.uint8 and np.array_equal(back, obs)


def test_malformed_stacks_are_refused() -> None:
    obs = _stacks(np.random.default_rng(1), 5, 2, 4, 8, resets=[])
    frames, whole = pack(obs)
    bad_first = whole.copy()
    bad_first[0, 1] = False
    with pytest.raises(WireFormatError, match="first row must travel whole"):
        unpack(frames, bad_first, obs.shape)
    with pytest.raises(WireFormatError, match="frames"):
        unpack(frames[:-1], whole, obs.shape)
    with pytest.raises(WireFormatError, match="mask"):
        unpack(frames, whole.astype(np.uint8), obs.shape)


def test_only_stacks_of_frames_are_tried() -> None:
    assert stackable((4, 84, 84), np.uint8)
    assert not stackable((84, 84, 4), np.uint8)  # channels last: the stack is not axis 0
    assert not stackable((4, 84, 84), np.float32)
    assert not stackable((17,), np.uint8)
    plain_rgb = np.random.default_rng(2).integers(0, 256, (9, 2, 3, 16, 16), dtype=np.uint8)
    assert packed(plain_rgb) is None  # no row is a shift: sent as it is


def test_atari_fragments_travel_at_a_quarter_of_the_bytes_and_decode_exactly() -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    settings = EnvSettings(env="ALE/Breakout-v5", atari=True)
    envs = make_vector_env(settings, 2, "sync")
    policy = Policy(envs.single_observation_space, envs.single_action_space, PolicySettings())
    try:
        fragment = Collector(envs, policy, 128, seed=5).collect()
    finally:
        envs.close()
    raw = serialize(fragment, 0, "abc", 0, 1)
    plain = fragment.observations.nbytes
    assert len(raw) <= 0.3 * plain, f"{len(raw):,} bytes for {plain:,} of observations"
    message = hetrl_pb2.WorkerMessage.FromString(raw)
    assert message == to_message(fragment, 0, "abc", 0, 1, 0.0)
    assert message.fragment.HasField("observation_stacks")
    assert not message.fragment.HasField("observations")
    layout = ObsLayout.box((4, 84, 84), np.uint8)
    received = from_message(message.fragment, expected_steps(128, 2, layout, (), np.int64))
    np.testing.assert_array_equal(received.arrays.observations, fragment.observations)
