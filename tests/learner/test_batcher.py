"""The learner's ingest pipeline off the training thread: the batcher (credits, lag,
batches assembled into reused host buffers), the weights publisher (newest only), the
update that reads the device once, and --fragments-per-batch auto through every parser."""

from __future__ import annotations

import queue
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch
import tyro

from hetrl.launch.hyperparameters import from_hyperparameters
from hetrl.learner.batcher import Batcher
from hetrl.learner.connections import StreamFailure
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.ppo import Batch, ppo_update
from hetrl.learner.publisher import Publisher
from hetrl.learner.settings import LearnerSettings, TrainSettings, auto_fragments_per_batch
from hetrl.rollout.errors import ConfigError, ProtocolError, WorkerLostError
from hetrl.rollout.fragments import FragmentArrays, ReceivedFragment
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import PolicySettings, from_json, to_json
from tests.helpers import wait_for

T, N = 5, 3


class FakeStream:
    """What the batcher needs of a WorkerStream: liveness, credits, weights."""

    def __init__(self) -> None:
        self.alive = True
        self.credits = 0
        self.weights = []
        self.generation = 1

    def return_credit(self, generation: int) -> None:
        if generation == self.generation:
            self.credits += 1

    def push_weights(self, weights) -> None:
        self.weights.append(weights)


def fragment(version: int, seed: int, invalid: int = 0) -> ReceivedFragment:
    rng = np.random.default_rng(seed)
    valid = np.ones((T, N), bool)
    valid.flat[:invalid] = False
    arrays = FragmentArrays(
        observations=rng.standard_normal((T + 1, N, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (T, N)), rewards=np.ones((T, N), np.float32),
        terminated=np.zeros((T, N), bool), truncated=np.zeros((T, N), bool),
        logprobs=np.full((T, N), -0.7, np.float32), valid=valid,
        episode_returns=np.array([float(seed)]), episode_lengths=np.array([7]),
        collect_seconds=0.5,
    )
    return ReceivedFragment(worker_id=0, incarnation="i", sequence=seed, policy_version=version,
                    arrays=arrays, wait_seconds=0.25)


def make_batcher(target=2, version=0, max_lag=10, budget=10**9):
    fan_in: queue.Queue = queue.Queue()
    stream = FakeStream()
    batcher = Batcher(fan_in, [stream], torch.device("cpu"), target=lambda: target,
                      version=version, max_policy_lag=max_lag,
                      budget_spent=lambda: batcher.global_step >= budget)
    return batcher, fan_in, stream


def test_batches_are_assembled_off_the_caller_with_credits_and_counts() -> None:
    batcher, fan_in, stream = make_batcher(target=2)
    batcher.start()
    try:
        frags = [fragment(0, seed, invalid=seed) for seed in range(4)]
        for f in frags:
            fan_in.put((stream, 1, f))
        first = batcher.next(timeout=10)
        assert first is not None
        # The first batch's credits go back as its fragments are taken; the second
        # batch's once the first has trained (its fragments train at the next version).
        second = batcher.next(timeout=10)
        assert second is not None
        assert stream.credits == 2
        assert batcher.lag_histogram == {0: 2, 1: 2}
        for s, generation in batcher.update_done(1):
            s.return_credit(generation)
        assert stream.credits == 4
        for ready, pair in ((first, frags[:2]), (second, frags[2:])):
            expected = np.concatenate([f.arrays.observations for f in pair], axis=1)
            np.testing.assert_array_equal(ready.batch.observations.numpy(), expected)
            valid = np.concatenate([f.arrays.valid for f in pair], axis=1).reshape(-1)
            assert ready.batch.valid_count == valid.sum()
            np.testing.assert_array_equal(ready.batch.valid_index.numpy(),
                                          np.flatnonzero(valid))
            assert [i.policy_version for i in ready.infos] == [0, 0]
            assert list(ready.episode_returns) == [float(f.sequence) for f in pair]
        assert batcher.global_step == 4 * T * N and batcher.episodes == 4
        # The host buffers are reused: after release, the next batch lands in one of them.
        slots = {id(first.slot), id(second.slot)}
        batcher.release(first)
        fan_in.put((stream, 1, fragment(0, 9)))
        fan_in.put((stream, 1, fragment(0, 10)))
        third = batcher.next(timeout=10)
        assert third is not None and id(third.slot) in slots
    finally:
        batcher.stop()


def test_batcher_holds_at_most_one_batch_beyond_the_one_in_training() -> None:
    batcher, fan_in, stream = make_batcher(target=1)
    batcher.start()
    try:
        for seed in range(5):
            fan_in.put((stream, 1, fragment(0, seed)))
        first = batcher.next(timeout=10)
        assert first is not None
        wait_for(lambda: fan_in.qsize() == 3, 10, "the second batch assembled")
        # Both slots are taken (one training, one ready): nothing more is taken off.
        with pytest.raises(AssertionError):
            wait_for(lambda: fan_in.qsize() < 3, 0.5, "more")
        assert stream.credits == 1  # the second batch's credit waits for the first update
    finally:
        batcher.stop()


def test_a_credit_waits_for_the_weights_its_batch_trains_at() -> None:
    # Prefetching the next batch must not add a version of lag: a fragment taken into a
    # batch behind one not yet trained gets its credit back only after that update's
    # weights are pushed, whether the update has started yet or not.
    stream = FakeStream()
    publisher = Publisher([stream], torch.device("cpu"))
    batcher, fan_in, _ = make_batcher(target=1)
    batcher._return_credit = publisher.return_credit
    batcher.start()
    try:
        fan_in.put((stream, 1, fragment(0, 0)))
        first = batcher.next(timeout=10)
        assert first is not None and stream.credits == 1  # nothing ahead of it
        # The first batch is handed out but its update has not begun: the second still
        # trains after it, at version 1, so its credit is held.
        fan_in.put((stream, 1, fragment(0, 1)))
        second = batcher.next(timeout=10)
        assert second is not None and stream.credits == 1
        assert batcher.lag_histogram == {0: 1, 1: 1}
        publisher.offer(1, {"w": torch.ones(2)})
        for s, generation in batcher.update_done(1):
            publisher.return_credit(s, generation)
        assert stream.credits == 1 and stream.weights == []  # deferred until pushed
        publisher.start()
        wait_for(lambda: stream.credits == 2, 10, "the credit after the weights")
        assert [w.version for w in stream.weights] == [1]
        batcher.release(first)
        # The second batch is training (version 1); a third trains at version 2.
        fan_in.put((stream, 1, fragment(1, 2)))
        third = batcher.next(timeout=10)
        assert third is not None and stream.credits == 2
        for s, generation in batcher.update_done(2):
            s.return_credit(generation)
        assert stream.credits == 3
        assert batcher.update_done(3) == []  # the third batch trained
        batcher.release(second)
        batcher.release(third)
        # Nothing ahead, nothing to publish: the credit goes back at once.
        fan_in.put((stream, 1, fragment(3, 3)))
        wait_for(lambda: stream.credits == 4, 10, "an immediate credit")
        assert batcher.lag_histogram == {0: 2, 1: 2}
    finally:
        batcher.stop()
        publisher.close()


def test_stale_fragments_are_dropped_counted_and_their_credit_returned() -> None:
    batcher, fan_in, stream = make_batcher(target=1, version=5, max_lag=3)
    batcher.start()
    try:
        fan_in.put((stream, 1, fragment(1, 0)))  # 4 updates old: dropped
        fan_in.put((stream, 1, fragment(2, 1)))  # 3: kept
        ready = batcher.next(timeout=10)
        assert ready is not None and ready.infos[0].policy_version == 2
        assert batcher.dropped_lag == 1 and stream.credits == 2
        assert batcher.lag_histogram == {4: 1, 3: 1}
    finally:
        batcher.stop()


def test_budget_spent_ends_the_batches() -> None:
    batcher, fan_in, stream = make_batcher(target=4, budget=2 * T * N)
    batcher.start()
    try:
        for seed in range(6):
            fan_in.put((stream, 1, fragment(0, seed)))
        ready = batcher.next(timeout=10)
        assert ready is not None and len(ready.infos) == 2  # what came before the budget
        assert batcher.next(timeout=10) is None and batcher.spent
        assert batcher.global_step == 2 * T * N  # nothing taken beyond the budget
    finally:
        batcher.stop()


def test_stream_failures_reach_the_training_thread() -> None:
    batcher, fan_in, stream = make_batcher()
    batcher.start()
    fan_in.put(StreamFailure("w:1", ProtocolError("bad hello")))
    with pytest.raises(ProtocolError, match="bad hello"):
        wait_for(lambda: batcher.next(timeout=0.5), 10, "the failure")
    batcher.stop()

    batcher, fan_in, stream = make_batcher()
    stream.alive = False
    batcher.start()
    fan_in.put(StreamFailure("w:1", ConnectionError("gone")))
    with pytest.raises(WorkerLostError):
        wait_for(lambda: batcher.next(timeout=0.5), 10, "the failure")
    batcher.stop()


def test_publisher_sends_the_newest_version_once_to_every_stream() -> None:
    streams = [FakeStream(), FakeStream()]
    publisher = Publisher(streams, torch.device("cpu"))
    state = {"w": torch.zeros(3)}
    # Offered before the thread runs: only the newest is published, never a backlog.
    for version in range(1, 6):
        publisher.offer(version, {"w": state["w"] + version})
    publisher.start()
    wait_for(lambda: publisher.published_version == 5, 10, "version 5 published")
    publisher.close()
    for stream in streams:
        assert [w.version for w in stream.weights] == [5]
        assert stream.weights[0] is streams[0].weights[0]  # serialized once
    assert publisher.skipped == 4


def test_update_with_host_counted_valid_steps_matches_the_device_count() -> None:
    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    rng = np.random.default_rng(0)
    t, n = 8, 6
    valid = rng.random((t, n)) > 0.2
    tensors = dict(
        observations=torch.from_numpy(rng.standard_normal((t + 1, n, 4)).astype(np.float32)),
        actions=torch.from_numpy(rng.integers(0, 2, (t, n))),
        logprobs=torch.full((t, n), -0.7), rewards=torch.ones(t, n),
        terminated=torch.zeros(t, n, dtype=torch.bool),
        truncated=torch.zeros(t, n, dtype=torch.bool), valid=torch.from_numpy(valid))
    flat = valid.reshape(-1)
    results = []
    for host in (False, True):
        torch.manual_seed(0)
        policy = Policy(obs_space, gym.spaces.Discrete(2), PolicySettings())
        optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
        extra = dict(valid_count=int(flat.sum()),
                     valid_index=torch.from_numpy(np.flatnonzero(flat))) if host else {}
        stats = ppo_update(policy, optimizer, Batch(**tensors, **extra), TrainSettings())
        results.append((stats, [p.detach().clone() for p in policy.parameters()]))
    (a, pa), (b, pb) = results
    assert a.keys() == b.keys() and all(isinstance(v, float) for v in b.values())
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7, nan_ok=True), key
    for x, y in zip(pa, pb, strict=True):
        torch.testing.assert_close(x, y)


def test_auto_fragments_per_batch_keeps_lag_near_two() -> None:
    assert auto_fragments_per_batch(2, 2) == 2  # hetrl local's default, as before
    assert auto_fragments_per_batch(14, 2) == 14
    assert auto_fragments_per_batch(140, 2) == 140
    assert auto_fragments_per_batch(3, 1) == 2
    assert auto_fragments_per_batch(0, 2) == 1  # none connected yet: still a batch
    assert auto_fragments_per_batch(2, 1, target_lag=0.5) == 4  # the continuous preset


@pytest.mark.parametrize("value", ["auto", 8])
def test_fragments_per_batch_through_cli_json_and_hyperparameters(value, tmp_path) -> None:
    import json

    from hetrl.launch.config import config_values

    args = ["--worker-addresses", "h:1", "--fragments-per-batch", str(value)]
    from_cli = tyro.cli(LearnerSettings, args=args)
    assert from_cli.fragments_per_batch == value
    assert from_json(LearnerSettings, to_json(from_cli)).fragments_per_batch == value
    for raw in (value, str(value)):
        assert from_hyperparameters({"fragments-per-batch": raw}, TrainSettings) == {
            "fragments_per_batch": value}
    assert TrainSettings().fragments_per_batch == "auto"
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"fragments_per_batch": value}))
    assert config_values(str(config), LearnerSettings) == {"fragments_per_batch": value}


@pytest.mark.parametrize("raw", ["x", 0, "0", 1.5])
def test_bad_fragments_per_batch_is_a_config_error(raw) -> None:
    with pytest.raises(ConfigError, match="fragments"):
        TrainSettings(**from_hyperparameters({"fragments_per_batch": raw}, TrainSettings))


def test_threads_are_named() -> None:
    batcher, *_ = make_batcher()
    publisher = Publisher([], torch.device("cpu"))
    batcher.start()
    publisher.start()
    names = {t.name for t in threading.enumerate()}
    batcher.stop()
    publisher.close()
    assert {"batcher", "weights-publisher"} <= names


@pytest.fixture
def serve_worker():
    """Start an in-process worker (a real gRPC server on loopback); return its address.
    A learner's Stop ends a worker, so each learner run gets its own."""
    from hetrl.rollout.settings import WorkerSettings
    from hetrl.rollout.transport import create_server
    from hetrl.rollout.worker import RolloutWorker, add_to_server

    started = []

    def serve() -> str:
        worker = RolloutWorker(WorkerSettings(env="CartPole-v1", envs_per_worker=3,
                                              fragment_length=5))
        server, port = create_server("127.0.0.1:0", "test-token")
        add_to_server(worker, server)
        server.start()
        started.append((worker, server))
        return f"127.0.0.1:{port}"

    yield serve
    for worker, server in started:
        worker.request_stop("test over")
        server.stop(0).wait(5)
        worker.close()


@pytest.fixture
def served_worker(serve_worker):
    return serve_worker()


@pytest.mark.parametrize("mode", ["drop", "fail"])
def test_a_nonfinite_update_is_rolled_back_and_never_published(
        served_worker, tmp_path, monkeypatch, mode) -> None:
    import json

    from hetrl.learner import learner as learner_module
    from hetrl.learner.learner import Learner

    real, calls = learner_module.ppo_update_async, []

    def poisoning(policy, *args):
        stats = real(policy, *args)
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                next(policy.parameters()).fill_(float("nan"))
        return stats

    monkeypatch.setattr(learner_module, "ppo_update_async", poisoning)
    settings = LearnerSettings(worker_addresses=(served_worker,), total_steps=15 * 12,
                               fragments_per_batch=1, out=str(tmp_path), progress=False,
                               nonfinite=mode)
    learner = Learner(settings, "test-token")
    code = learner.run()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["updates_nonfinite"] == 1
    assert all(torch.isfinite(p).all() for p in learner.policy.parameters())
    if mode == "fail":
        assert code == 1 and summary["policy_version"] == 2
    else:
        assert code == 0 and summary["policy_version"] == len(calls) - 1
    assert learner.publisher.published_version <= summary["policy_version"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_update_never_syncs_with_the_host_on_cuda() -> None:
    device = torch.device("cuda")
    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    policy = Policy(obs_space, gym.spaces.Discrete(2), PolicySettings()).to(device)
    optimizer = PolicyAdam(policy, 1e-3)  # the learner's: flat, fused on CUDA
    t, n = 8, 6
    batch = Batch(observations=torch.randn(t + 1, n, 4, device=device),
                  actions=torch.randint(0, 2, (t, n), device=device),
                  logprobs=torch.full((t, n), -0.7, device=device),
                  rewards=torch.ones(t, n, device=device),
                  terminated=torch.zeros(t, n, dtype=torch.bool, device=device),
                  truncated=torch.zeros(t, n, dtype=torch.bool, device=device),
                  valid=torch.ones(t, n, dtype=torch.bool, device=device),
                  valid_count=t * n)
    from hetrl.learner.ppo import ppo_update_async

    ppo_update_async(policy, optimizer, batch, TrainSettings())  # warm-up (lazy init)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ppo_update_async(policy, optimizer, batch, TrainSettings())
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_a_resumed_learner_counts_on_from_its_checkpoint(serve_worker, tmp_path) -> None:
    import json

    from hetrl.learner.learner import Learner

    def run(total: int, resume: bool) -> dict:
        settings = LearnerSettings(worker_addresses=(serve_worker(),), total_steps=total,
                                   fragments_per_batch=1, out=str(tmp_path), progress=False,
                                   resume=resume)
        assert Learner(settings, "test-token").run() == 0
        return json.loads((tmp_path / "summary.json").read_text())

    first = run(15 * 4, resume=False)
    second = run(15 * 8, resume=True)
    assert second["resumed_from"] and second["global_step"] >= 15 * 8
    assert second["policy_version"] > first["policy_version"]


def test_central_batches_take_one_fragment_per_worker_and_hold_the_rest_back() -> None:
    """Central inference: a second fragment of a worker already in the batch waits, credit
    kept, for the next batch, so no update happens without every worker's fragment."""
    fan_in: queue.Queue = queue.Queue()
    fast, slow = FakeStream(), FakeStream()
    batcher = Batcher(fan_in, [fast, slow], torch.device("cpu"), target=lambda: 2,
                      version=0, max_policy_lag=10,
                      budget_spent=lambda: False, one_per_stream=True)
    batcher.start()
    try:
        fan_in.put((fast, 1, fragment(0, 1)))
        fan_in.put((fast, 1, fragment(0, 2)))
        wait_for(lambda: fan_in.empty(), 10, "both taken")
        assert batcher.next(timeout=0.5) is None  # no batch without the slow worker
        assert fast.credits == 1  # the set-aside fragment's credit stays out
        fan_in.put((slow, 1, fragment(0, 3)))
        first = batcher.next(timeout=10)
        assert first is not None
        assert [float(r) for r in first.episode_returns] == [1.0, 3.0]
        batcher.release(first)
        fan_in.put((slow, 1, fragment(0, 4)))
        second = batcher.next(timeout=10)
        assert second is not None
        assert [float(r) for r in second.episode_returns] == [2.0, 4.0]
        assert fast.credits == 1 and slow.credits == 1  # until the first batch trains
        for stream, generation in batcher.update_done(1):
            stream.return_credit(generation)
        assert fast.credits == 2 and slow.credits == 2
    finally:
        batcher.stop()


def test_synchronous_credits_wait_for_their_own_batch_and_a_short_batch_closes() -> None:
    """--synchronous: no credit goes back before the update of the batch its fragment is
    in, so every fragment trains at lag 0; a batch whose last worker stopped streaming
    trains what it has instead of waiting for a fragment that cannot come."""
    fan_in: queue.Queue = queue.Queue()
    a, b = FakeStream(), FakeStream()
    streaming = [a, b]
    batcher = Batcher(fan_in, [a, b], torch.device("cpu"), target=lambda: len(streaming),
                      version=0, max_policy_lag=0, budget_spent=lambda: False,
                      synchronous=True)
    batcher.start()
    try:
        fan_in.put((a, 1, fragment(0, 1)))
        fan_in.put((b, 1, fragment(0, 2)))
        first = batcher.next(timeout=10)
        assert first is not None and len(first.infos) == 2
        assert a.credits == 0 and b.credits == 0  # held through the batch's own update
        assert batcher.next(timeout=0.5) is None  # nothing was sampled meanwhile
        for stream, generation in batcher.update_done(1):
            stream.return_credit(generation)
        assert a.credits == 1 and b.credits == 1
        batcher.release(first)
        fan_in.put((a, 1, fragment(1, 3)))
        assert batcher.next(timeout=1.0) is None  # b still streams: the batch waits
        streaming.remove(b)  # b lost for good, its credit with it
        second = batcher.next(timeout=10)
        assert second is not None and [i.policy_version for i in second.infos] == [1]
        assert a.credits == 1  # still held until this batch trains
        for stream, generation in batcher.update_done(2):
            stream.return_credit(generation)
        assert a.credits == 2
        assert batcher.lag_histogram == {0: 3} and batcher.dropped_lag == 0
    finally:
        batcher.stop()


def test_synchronous_batch_is_every_credit_and_refuses_a_fixed_size() -> None:
    settings = TrainSettings(synchronous=True, credits_per_worker=2)
    assert settings.batch_fragments(3) == 6
    assert settings.batch_fragments(0) == 2
    with pytest.raises(ConfigError, match="--synchronous"):
        TrainSettings(synchronous=True, fragments_per_batch=4)


def test_failed_publications_are_counted_and_three_in_a_row_end_the_run() -> None:
    from hetrl.learner.publisher import MAX_FAILURES_IN_A_ROW
    from hetrl.rollout.errors import HetrlError

    class Broken(FakeStream):
        fail = True

        def push_weights(self, weights) -> None:
            if self.fail:
                raise OSError("network gone")
            super().push_weights(weights)

    stream = Broken()
    publisher = Publisher([stream], torch.device("cpu"))
    publisher.start()
    try:
        publisher.offer(1, {"w": torch.ones(2)})
        wait_for(lambda: publisher.failures == 1, 10, "a failed publication")
        publisher.check()  # one is survived
        stream.fail = False
        publisher.offer(2, {"w": torch.ones(2)})
        wait_for(lambda: publisher.published_version == 2, 10, "a good one")
        stream.fail = True
        for version in range(3, 3 + MAX_FAILURES_IN_A_ROW):
            publisher.offer(version, {"w": torch.ones(2)})
            wait_for(lambda v=version: publisher.failures == v - 1, 10, "a failure")
        with pytest.raises(HetrlError, match="failed 3 times in a row.*network gone"):
            publisher.check()
    finally:
        publisher.close()
