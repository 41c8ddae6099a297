"""Frames: what stacked Atari frames cost on the wire, sent whole or once per frame.

One worker's collection, as `hetrl local` runs it with the atari preset: ALE/Pong-v5
through the Atari pipeline (84x84 grayscale, 4 frames stacked), 8 envs, 128-step
fragments, the built-in CNN choosing actions on one torch thread. For each fragment it
times the collection, then encodes it both ways with `fragments.serialize` (the
worker's send path): `whole`, every observation's 4 frames (what hetrl sent before
rollout/stacks.py), and `packed`, each frame once; and decodes both with
`fragments.from_message` (the learner's receive path). Targets (issue 29): packed
bytes per agent step <= 0.3x whole, and the collection overhead (collect + encode)
no worse. Run: `python -m bench.frames [--quick]`; record bench/results/summary_frames.json.
"""

from __future__ import annotations

import dataclasses
import time
from unittest import mock

import numpy as np
import torch
import tyro

from bench import common
from hetrl.protos import hetrl_pb2
from hetrl.rollout import fragments
from hetrl.rollout.collector import Collector
from hetrl.rollout.envs import make_vector_env
from hetrl.rollout.observations import ObsLayout
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import EnvSettings, PolicySettings


@dataclasses.dataclass
class Settings:
    """Stacked Atari frames on the wire."""

    env: str = "ALE/Pong-v5"
    envs: int = 8
    fragment_length: int = 128
    fragments: int = 12
    """Fragments timed (after one warm-up)."""
    quick: bool = False
    """3 fragments of 64 steps."""


def _encode_decode(fragment, expected: dict, whole: bool) -> tuple[int, float, float]:
    """(bytes, encode s, decode s) of one fragment, its frames whole or packed."""
    patch = mock.patch.object(fragments, "packed", lambda _: None) if whole else None
    if patch is not None:
        patch.start()
    try:
        start = time.perf_counter()
        raw = fragments.serialize(fragment, 0, "bench", 0, 1)
        encoded = time.perf_counter() - start
    finally:
        if patch is not None:
            patch.stop()
    start = time.perf_counter()
    message = hetrl_pb2.WorkerMessage.FromString(raw).fragment
    received = fragments.from_message(message, expected)
    decoded = time.perf_counter() - start
    assert np.array_equal(received.arrays.observations, fragment.observations)
    return len(raw), encoded, decoded


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, fragments=3, fragment_length=64)
    torch.set_num_threads(1)
    env_settings = EnvSettings(env=s.env, atari=True)
    envs = make_vector_env(env_settings, s.envs, "sync")
    obs_space = envs.single_observation_space
    policy = Policy(obs_space, envs.single_action_space, PolicySettings())
    collector = Collector(envs, policy, s.fragment_length, seed=1)
    expected = fragments.expected_steps(s.fragment_length, s.envs,
                                        ObsLayout.box(obs_space.shape, np.uint8), (), np.int64)
    rows: dict[str, list[dict]] = {"whole": [], "packed": []}
    collect_s = []
    try:
        collector.collect()  # warm-up
        for _ in range(s.fragments):
            start = time.perf_counter()
            fragment = collector.collect()
            collect_s.append(time.perf_counter() - start)
            for way in rows:
                size, enc, dec = _encode_decode(fragment, expected, way == "whole")
                rows[way].append({"bytes": size, "encode_s": enc, "decode_s": dec})
    finally:
        envs.close()
    steps = s.envs * s.fragment_length
    collect = float(np.mean(collect_s))
    results: dict = {"agent_steps_per_fragment": steps, "collect_s": common.summarize(collect_s)}
    for way, samples in rows.items():
        encode = float(np.mean([r["encode_s"] for r in samples]))
        results[way] = {
            "bytes_per_agent_step": float(np.mean([r["bytes"] for r in samples])) / steps,
            "encode_ms": common.summarize([1e3 * r["encode_s"] for r in samples]),
            "decode_ms": common.summarize([1e3 * r["decode_s"] for r in samples]),
            "collect_and_encode_s_per_1k_steps": 1e3 * (collect + encode) / steps,
        }
    ratio = results["packed"]["bytes_per_agent_step"] / results["whole"]["bytes_per_agent_step"]
    overhead = (results["packed"]["collect_and_encode_s_per_1k_steps"]
                / results["whole"]["collect_and_encode_s_per_1k_steps"])
    results.update(bytes_ratio=ratio, collect_and_encode_ratio=overhead,
                   passed=bool(ratio <= 0.3 and overhead <= 1.02))
    common.print_table(
        f"{s.env} through the Atari pipeline, {s.envs} envs x {s.fragment_length} steps, "
        f"{s.fragments} fragments; collection {collect:.2f} s a fragment. Targets: bytes "
        f"<= 0.3x ({ratio:.3f}x), collect + encode no worse ({overhead:.3f}x): "
        f"{'PASS' if results['passed'] else 'FAIL'}",
        ["frames", "bytes / agent step", "encode ms", "decode ms",
         "collect + encode s / 1k steps"],
        [[way, f"{r['bytes_per_agent_step']:,.0f}", common.fmt(r["encode_ms"], ".1f"),
          common.fmt(r["decode_ms"], ".1f"), f"{r['collect_and_encode_s_per_1k_steps']:.3f}"]
         for way, r in ((w, results[w]) for w in rows)])
    common.write_json("summary_frames", s, results)
    return results


if __name__ == "__main__":
    main()
