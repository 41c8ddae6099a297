"""A real worker and the learner's stream over loopback gRPC: hello, weights, credits,
stop, authentication. The worker runs in this process (its own gRPC server threads)."""

from __future__ import annotations

import queue
import time

import grpc
import numpy as np
import pytest

from hetrl.learner.connections import StreamFailure, StreamSpec, WorkerStream
from hetrl.protos import hetrl_pb2, hetrl_pb2_grpc
from hetrl.rollout import wire
from hetrl.rollout.envs import action_dtype
from hetrl.rollout.errors import ProtocolError
from hetrl.rollout.observations import ObsLayout
from hetrl.rollout.policy import Policy, policy_arrays
from hetrl.rollout.settings import WorkerSettings
from hetrl.rollout.transport import auth_metadata, create_channel, create_server
from hetrl.rollout.worker import RolloutWorker, add_to_server

TOKEN = "test-token"


def wait_for(condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def served_worker():
    settings = WorkerSettings(env="CartPole-v1", envs_per_worker=3, fragment_length=5)
    worker = RolloutWorker(settings)
    server, port = create_server("127.0.0.1:0", TOKEN)
    add_to_server(worker, server)
    server.start()
    yield worker, f"127.0.0.1:{port}", settings
    worker.request_stop("test over")
    server.stop(0).wait(5)
    worker.close()


def make_spec(worker: RolloutWorker, env: str = "CartPole-v1") -> StreamSpec:
    obs, act = worker.envs.single_observation_space, worker.envs.single_action_space
    return StreamSpec(env, str(obs), str(act), ObsLayout.of(obs), act.shape or (),
                      action_dtype(act))


def weights_message(worker: RolloutWorker, settings, version: int) -> hetrl_pb2.Weights:
    policy = Policy(worker.envs.single_observation_space, worker.envs.single_action_space,
                    settings)
    return hetrl_pb2.Weights(version=version, arrays=wire.encode_named(policy_arrays(policy)))


def test_credits_bound_the_worker_and_weights_set_the_version(served_worker) -> None:
    worker, address, settings = served_worker
    fan_in: queue.Queue = queue.Queue()
    stream = WorkerStream(address, TOKEN, make_spec(worker), fan_in,
                          weights_message(worker, settings, 7), credits=2, connect_timeout=10)
    stream.start()
    first = [fan_in.get(timeout=10)[2] for _ in range(2)]
    assert [f.sequence for f in first] == [0, 1]
    assert all(f.policy_version == 7 for f in first)
    assert first[0].arrays.observations.shape == (6, 3, 4)
    # Without a returned credit the worker must not send a third fragment.
    time.sleep(0.3)
    assert fan_in.empty() and worker.fragments_sent == 2
    stream.push_weights(weights_message(worker, settings, 8))
    stream.return_credit(stream.generation)
    third = fan_in.get(timeout=10)[2]
    assert third.sequence == 2 and third.policy_version == 8
    # Consecutive fragments continue the same episodes: the first row of the next
    # fragment is the bootstrap row of the previous one.
    np.testing.assert_array_equal(third.arrays.observations[0], first[1].arrays.observations[-1])
    assert stream.stop("done", timeout=10)
    wait_for(worker.stopped.is_set, what="worker stop")
    assert worker.stop_reason == "learner: done"


def test_hello_mismatch_is_a_protocol_error(served_worker) -> None:
    worker, address, settings = served_worker
    fan_in: queue.Queue = queue.Queue()
    spec = make_spec(worker, env="Acrobot-v1")
    stream = WorkerStream(address, TOKEN, spec, fan_in, weights_message(worker, settings, 0),
                          credits=1, connect_timeout=10)
    stream.start()
    failure = fan_in.get(timeout=10)
    assert isinstance(failure, StreamFailure)
    assert isinstance(failure.error, ProtocolError)
    assert "same --env" in str(failure.error)


@pytest.mark.parametrize("metadata", [(), auth_metadata("wrong-token")])
def test_calls_without_the_token_are_refused(served_worker, metadata) -> None:
    worker, address, _ = served_worker
    stub = hetrl_pb2_grpc.RolloutStub(create_channel(address))
    responses = stub.Stream(iter([]), metadata=metadata, timeout=5)
    with pytest.raises(grpc.RpcError) as info:
        next(responses)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert worker.fragments_sent == 0


def test_second_learner_is_refused(served_worker) -> None:
    worker, address, settings = served_worker
    fan_in: queue.Queue = queue.Queue()
    stream = WorkerStream(address, TOKEN, make_spec(worker), fan_in,
                          weights_message(worker, settings, 0), credits=1, connect_timeout=10)
    stream.start()
    fan_in.get(timeout=10)
    stub = hetrl_pb2_grpc.RolloutStub(create_channel(address))
    responses = stub.Stream(iter([]), metadata=auth_metadata(TOKEN), timeout=5)
    with pytest.raises(grpc.RpcError) as info:
        next(responses)
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    stream.stop("done")


def test_unreachable_worker_fails_after_connect_timeout() -> None:
    fan_in: queue.Queue = queue.Queue()
    spec = StreamSpec("CartPole-v1", "", "", ObsLayout.box((4,), "<f4"), (),
                      np.dtype(np.int64))
    stream = WorkerStream("127.0.0.1:1", TOKEN, spec, fan_in, hetrl_pb2.Weights(), credits=1,
                          connect_timeout=1.0)
    start = time.monotonic()
    stream.start()
    failure = fan_in.get(timeout=10)
    assert isinstance(failure, StreamFailure)
    assert "nothing answered at worker 127.0.0.1:1" in str(failure.error)
    assert time.monotonic() - start < 5
