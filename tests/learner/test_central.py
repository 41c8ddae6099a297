"""Central inference over loopback gRPC: a real env server (rollout/env_server.py), the
learner's stream and its inference thread (learner/inference.py), in this process.

What central inference must keep from worker inference: fragments shaped and cut the
same way (checked against the collector on the same env, seeds and actions), credits
that bound what is in flight, the newest weights choosing the actions, malformed input
refused and counted on both sides, a reconnect that resets the envs and loses only what
was unfinished (counted), and an env host that needs no torch.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from hetrl.learner.central import CentralAssembler, CentralShapes
from hetrl.learner.connections import StreamFailure, StreamSpec, WorkerStream
from hetrl.learner.inference import InferenceServer
from hetrl.protos import hetrl_pb2, hetrl_pb2_grpc
from hetrl.rollout import wire
from hetrl.rollout.collector import Collector
from hetrl.rollout.env_server import EnvServer, env_step_message, group_sizes
from hetrl.rollout.envs import action_dtype, make_vector_env
from hetrl.rollout.errors import ProtocolError, WireFormatError
from hetrl.rollout.observations import ObsLayout
from hetrl.rollout.policy import Policy
from hetrl.rollout.serving import add_to_server
from hetrl.rollout.settings import WorkerSettings
from hetrl.rollout.stepping import EnvStepper
from hetrl.rollout.transport import auth_metadata, create_channel, create_server
from tests.helpers import wait_for

TOKEN = "test-token"


def spec_of(envs) -> StreamSpec:
    obs, act = envs.single_observation_space, envs.single_action_space
    return StreamSpec("CartPole-v1", str(obs), str(act), ObsLayout.of(obs),
                      act.shape or (), action_dtype(act))


@pytest.fixture
def served_env_server():
    settings = WorkerSettings(env="CartPole-v1", envs_per_worker=3, fragment_length=5,
                              inference="central")
    server = EnvServer(settings)
    grpc_server, port = create_server("127.0.0.1:0", TOKEN)
    add_to_server(server, grpc_server)
    grpc_server.start()
    yield server, f"127.0.0.1:{port}", settings
    server.request_stop("test over")
    grpc_server.stop(0).wait(5)
    server.close()


def inference_for(server: EnvServer, settings: WorkerSettings, version: int = 0):
    envs = server.groups[0].envs
    policy = Policy(envs.single_observation_space, envs.single_action_space, settings)
    inference = InferenceServer(envs.single_observation_space, envs.single_action_space,
                                settings, torch_cpu(), policy.state_dict(), version)
    inference.start()
    return inference, policy


def torch_cpu():
    import torch

    return torch.device("cpu")


def test_credits_bound_central_streams_and_new_weights_choose_the_actions(
        served_env_server) -> None:
    server, address, settings = served_env_server
    inference, policy = inference_for(server, settings, version=3)
    fan_in: queue.Queue = queue.Queue()
    stream = WorkerStream(address, TOKEN, spec_of(server.groups[0].envs), fan_in,
                          hetrl_pb2.Weights(), credits=2, connect_timeout=10,
                          inference=inference)
    stream.start()
    first = [fan_in.get(timeout=10)[2] for _ in range(2)]
    assert [f.sequence for f in first] == [0, 1]
    assert all(f.policy_version == 3 for f in first)
    # One worker fragment of all 3 envs (groups of 2 and 1 joined), T = 5.
    assert first[0].arrays.observations.shape == (6, 3, 4)
    assert first[0].arrays.actions.shape == (5, 3)
    np.testing.assert_array_equal(first[1].arrays.observations[0],
                                  first[0].arrays.observations[-1])
    # Without a credit no group starts a third fragment: the env server stops stepping
    # once each group has its one step past the end (whose actions wait for the credit).
    time.sleep(0.3)
    sent = server.steps_sent
    time.sleep(0.3)
    assert server.steps_sent == sent and fan_in.empty()
    assert server.steps_sent <= 2 * 2 * 5  # 2 fragments x 2 groups x 5 steps
    inference.load(4, policy.state_dict())
    stream.return_credit(stream.generation)
    third = fan_in.get(timeout=10)[2]
    assert third.sequence == 2 and third.policy_version == 4
    np.testing.assert_array_equal(third.arrays.observations[0],
                                  first[1].arrays.observations[-1])
    assert inference.passes > 0 and inference.rows >= 3 * 15
    assert stream.stop("done", timeout=10)
    wait_for(server.stopped.is_set, 10, "env server stop")
    assert server.stop_reason == "learner: done"
    inference.close()


def test_central_assembly_cuts_fragments_exactly_as_the_collector_does() -> None:
    """Same env, seed and actions: the fragments built on the learner from two groups'
    steps equal the worker collector's, autoreset steps, episode ends and all."""
    settings = WorkerSettings(env="CartPole-v1", envs_per_worker=4, fragment_length=20)
    rng = np.random.default_rng(0)
    script = [rng.integers(0, 2, size=4) for _ in range(60)]

    class FixedPolicy:
        state_size = 0  # feed-forward

        def __init__(self):
            self.i = 0

        def act(self, obs):
            a = script[self.i]
            self.i += 1
            return a, np.full(4, -0.5, np.float32)

        def env_actions(self, a):
            return a

    reference = Collector(make_vector_env(settings, 4, "sync"), FixedPolicy(), 20, seed=11)
    expected = [reference.collect() for _ in range(3)]

    sizes = group_sizes(4)
    steppers = [EnvStepper(make_vector_env(settings, n, "sync")) for n in sizes]
    hello = hetrl_pb2.Hello(worker_id=0, num_envs=4, fragment_length=20, env_groups=2)
    obs_space = steppers[0].envs.single_observation_space
    shapes = CentralShapes(ObsLayout.of(obs_space), (), np.dtype(np.int64))
    per_group = [[a[:2] for a in script], [a[2:] for a in script]]
    sent: list[hetrl_pb2.Actions] = []
    routed_group = [0]

    class Scripted:
        """Answers at once, with the script's actions for the group being driven."""

        def submit(self, observations, reply, memory=None):
            action = per_group[routed_group[0]].pop(0)
            reply(action, np.full(len(observations), -0.5, np.float32), action, 7)

    # Group g's envs are envs 2g, 2g+1 of the reference, seeded alike.
    assembler = CentralAssembler(hello, shapes, credits=3, inference=Scripted(),
                                 send=sent.append)
    got = []
    results = [steppers[g].reset(seed=11 + 2 * g) for g in range(2)]
    zeros = np.zeros(2, dtype=bool)
    steps = [0, 0]
    for g in range(2):
        routed_group[0] = g
        got += assembler.on_env_step(hetrl_pb2.EnvStep.FromString(
            hetrl_pb2.WorkerMessage.FromString(env_step_message(
                g, 0, results[g], np.zeros(2, np.float32), zeros, zeros, zeros)).env_step
            .SerializeToString()))
    while len(got) < 3:
        for g in range(2):
            action = wire.decode(sent.pop(0).actions)
            result = steppers[g].step(action)
            steps[g] += 1
            routed_group[0] = g
            message = hetrl_pb2.WorkerMessage.FromString(
                env_step_message(g, steps[g], *result)).env_step
            got += assembler.on_env_step(message)
    for (fragment, version, _waited), want in zip(got, expected, strict=True):
        assert version == 7
        for name in ("observations", "actions", "rewards", "terminated", "truncated",
                     "logprobs", "valid"):
            np.testing.assert_array_equal(getattr(fragment, name), getattr(want, name),
                                          err_msg=name)
        assert sorted(fragment.episode_returns) == sorted(want.episode_returns)


def test_lost_lives_and_clipped_rewards_reach_the_learners_fragments() -> None:
    """--episodic-life and --clip-rewards under central inference: the env server sends
    which envs lost a life, the learner's fragments end value targets there and train
    on reward signs, while the reported return stays the raw sum."""
    hello = hetrl_pb2.Hello(worker_id=0, num_envs=2, fragment_length=3, env_groups=2,
                            clip_rewards=True)
    shapes = CentralShapes(ObsLayout.box((3,), np.float32), (), np.dtype(np.int64))
    sent: list[hetrl_pb2.Actions] = []

    class Answers:
        def submit(self, observations, reply, memory=None):
            zeros = np.zeros(len(observations), np.int64)
            reply(zeros, np.zeros(len(observations), np.float32), zeros, 1)

    assembler = CentralAssembler(hello, shapes, credits=1, inference=Answers(),
                                 send=sent.append)
    no = np.zeros(1, dtype=bool)
    steps = [  # group 1 steps alike without losing lives
        (np.float32(0), no, no),
        (np.float32(5), np.ones(1, bool), no),  # a life lost, 5 points
        (np.float32(2), no, no),
        (np.float32(-3), no, np.ones(1, bool)),  # game over
    ]
    got = []
    for step, (reward, lost, ended) in enumerate(steps):
        for group in range(2):
            message = env_step_message(group, step, np.zeros((1, 3), np.float32),
                                       np.full(1, reward), ended, no, no,
                                       life_lost=lost if step and group == 0 else no)
            got += assembler.on_env_step(hetrl_pb2.WorkerMessage.FromString(message).env_step)
    ((fragment, _, _),) = got
    np.testing.assert_array_equal(fragment.terminated, [[True, False], [False, False],
                                                         [True, True]])
    np.testing.assert_array_equal(fragment.rewards, [[1, 1], [1, 1], [-1, -1]])
    assert fragment.episode_returns.tolist() == [4.0, 4.0]
    bad = env_step_message(0, 4, np.zeros((1, 3), np.float32), np.zeros(1), no, no, no,
                           life_lost=np.zeros(2, bool))
    with pytest.raises(WireFormatError, match="life_lost"):
        assembler.on_env_step(hetrl_pb2.WorkerMessage.FromString(bad).env_step)


def test_frame_stacks_reach_the_central_learner_as_new_frames_and_rebuild_exactly() -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    settings = WorkerSettings(env="ALE/Breakout-v5", atari=True)
    steppers = [EnvStepper(make_vector_env(settings, 1, "sync")) for _ in range(2)]
    try:
        obs_space = steppers[0].envs.single_observation_space
        hello = hetrl_pb2.Hello(worker_id=0, num_envs=2, fragment_length=40, env_groups=2)
        shapes = CentralShapes(ObsLayout.of(obs_space), (), np.dtype(np.int64))
        sent: list[hetrl_pb2.Actions] = []

        class Random:
            def submit(self, observations, reply, memory=None):
                actions = np.random.default_rng(len(sent)).integers(0, 4, len(observations))
                reply(actions, np.zeros(len(observations), np.float32), actions, 1)

        assembler = CentralAssembler(hello, shapes, credits=1, inference=Random(),
                                     send=sent.append)
        seen: list[list[np.ndarray]] = [[], []]
        held: list = [None, None]
        sizes, got = [], []
        no = np.zeros(1, bool)
        for g in range(2):
            obs = steppers[g].reset(seed=g)
            seen[g].append(obs.copy())
            held[g] = obs.copy()
            raw = env_step_message(g, 0, obs, np.zeros(1, np.float32), no, no, no)
            got += assembler.on_env_step(hetrl_pb2.WorkerMessage.FromString(raw).env_step)
        for step in range(1, 41):
            for g in range(2):
                result = steppers[g].step(wire.decode(sent.pop(0).actions))
                seen[g].append(result.observations.copy())
                raw = env_step_message(g, step, *result, previous=held[g])
                held[g] = result.observations.copy()
                sizes.append(len(raw))
                got += assembler.on_env_step(
                    hetrl_pb2.WorkerMessage.FromString(raw).env_step)
        ((fragment, _, _),) = got
        for g in range(2):
            np.testing.assert_array_equal(fragment.observations[:, g], np.stack(seen[g])[:, 0])
        whole = obs_space.shape[0] * 84 * 84
        assert np.median(sizes) < 0.3 * whole, sizes
    finally:
        for stepper in steppers:
            stepper.close()


def test_a_learner_in_central_mode_refuses_a_worker_inference_worker() -> None:
    settings = WorkerSettings(env="CartPole-v1", envs_per_worker=2, fragment_length=5)
    from hetrl.rollout.worker import RolloutWorker

    worker = RolloutWorker(settings)
    grpc_server, port = create_server("127.0.0.1:0", TOKEN)
    add_to_server(worker, grpc_server)
    grpc_server.start()
    try:
        inference, _ = inference_for_envs(worker.envs, settings)
        fan_in: queue.Queue = queue.Queue()
        stream = WorkerStream(f"127.0.0.1:{port}", TOKEN, spec_of(worker.envs), fan_in,
                              hetrl_pb2.Weights(), credits=1, connect_timeout=10,
                              inference=inference)
        stream.start()
        failure = fan_in.get(timeout=10)
        assert isinstance(failure, StreamFailure) and isinstance(failure.error, ProtocolError)
        assert "--inference" in str(failure.error)
        inference.close()
    finally:
        worker.request_stop("test over")
        grpc_server.stop(0).wait(5)
        worker.close()


def inference_for_envs(envs, settings):
    policy = Policy(envs.single_observation_space, envs.single_action_space, settings)
    inference = InferenceServer(envs.single_observation_space, envs.single_action_space,
                                settings, torch_cpu(), policy.state_dict(), 0)
    inference.start()
    return inference, policy


def _raw_stream(address: str, requests):
    stub = hetrl_pb2_grpc.RolloutStub(create_channel(address))
    return stub.Stream(requests, metadata=auth_metadata(TOKEN), timeout=10)


@pytest.mark.parametrize("bad", [
    hetrl_pb2.Actions(group=5, step=0, actions=wire.encode(np.zeros(2, np.int64))),
    hetrl_pb2.Actions(group=0, step=3, actions=wire.encode(np.zeros(2, np.int64))),
    hetrl_pb2.Actions(group=0, step=0, actions=wire.encode(np.zeros(3, np.int64))),
    hetrl_pb2.Actions(group=0, step=0, actions=wire.encode(np.zeros(2, np.float32))),
])
def test_the_env_server_refuses_malformed_actions_and_serves_on(served_env_server, bad) -> None:
    server, address, _ = served_env_server
    requests: queue.Queue = queue.Queue()
    responses = _raw_stream(address, iter(requests.get, None))
    kinds = [next(responses).WhichOneof("kind") for _ in range(3)]
    assert kinds == ["hello", "env_step", "env_step"]
    requests.put(hetrl_pb2.LearnerMessage(actions=bad))
    with pytest.raises(grpc.RpcError) as info:
        next(responses)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server.messages_malformed == 1
    requests.put(None)
    # It serves the next learner: a fresh stream, envs reset, step numbers from 0.
    wait_for(lambda: server.state.value == "idle", 10, "the stream to end")
    again: queue.Queue = queue.Queue()
    responses = _raw_stream(address, iter(again.get, None))
    assert next(responses).WhichOneof("kind") == "hello"
    step = next(responses).env_step
    assert (step.group, step.step) == (0, 0)
    again.put(None)


def test_calls_without_the_token_are_refused_by_the_env_server(served_env_server) -> None:
    server, address, _ = served_env_server
    stub = hetrl_pb2_grpc.RolloutStub(create_channel(address))
    responses = stub.Stream(iter([]), metadata=auth_metadata("wrong"), timeout=5)
    with pytest.raises(grpc.RpcError) as info:
        next(responses)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert server.steps_sent == 0


class BadThenGoodServer(hetrl_pb2_grpc.RolloutServicer):
    """A central worker whose first stream sends one malformed env step."""

    def __init__(self, real: EnvServer) -> None:
        self.real, self.streams = real, 0

    def Stream(self, request_iterator, context):
        self.streams += 1
        if self.streams == 1:
            yield hetrl_pb2.WorkerMessage(hello=self.real.hello).SerializeToString()
            yield env_step_message(0, 0, np.zeros((2, 3), np.float32), np.zeros(2, np.float32),
                                   *[np.zeros(2, bool)] * 3)
            time.sleep(5)
            return
        yield from self.real.Stream(request_iterator, context)


def test_a_malformed_env_step_is_counted_and_the_stream_starts_again_from_reset() -> None:
    settings = WorkerSettings(env="CartPole-v1", envs_per_worker=3, fragment_length=5,
                              inference="central")
    real = EnvServer(settings)
    fake = BadThenGoodServer(real)
    grpc_server, port = create_server("127.0.0.1:0", TOKEN)
    handler = grpc.stream_stream_rpc_method_handler(fake.Stream)
    grpc_server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("hetrl.Rollout", {"Stream": handler}),))
    grpc_server.start()
    inference, _ = inference_for_envs(real.groups[0].envs, settings)
    fan_in: queue.Queue = queue.Queue()
    stream = WorkerStream(f"127.0.0.1:{port}", TOKEN, spec_of(real.groups[0].envs), fan_in,
                          hetrl_pb2.Weights(), credits=1, connect_timeout=10,
                          inference=inference)
    try:
        stream.start()
        fragment = fan_in.get(timeout=15)[2]
        assert stream.env_steps_malformed == 1 and stream.reconnects == 1
        assert fragment.sequence == 0 and fragment.arrays.observations.shape == (6, 3, 4)
        assert fake.streams == 2
    finally:
        stream.stop("done", timeout=5)
        inference.close()
        grpc_server.stop(0).wait(5)
        real.close()


def test_a_broken_stream_loses_only_its_unfinished_fragments() -> None:
    length = 200  # long, so that the break lands inside the second fragment
    settings = WorkerSettings(env="CartPole-v1", envs_per_worker=3, fragment_length=length,
                              inference="central")
    server = EnvServer(settings)
    grpc_server, port = create_server("127.0.0.1:0", TOKEN)
    add_to_server(server, grpc_server)
    grpc_server.start()
    inference, _ = inference_for(server, settings)
    fan_in: queue.Queue = queue.Queue()
    stream = WorkerStream(f"127.0.0.1:{port}", TOKEN, spec_of(server.groups[0].envs), fan_in,
                          hetrl_pb2.Weights(), credits=1, connect_timeout=1.0,
                          inference=inference)
    try:
        stream.start()
        first = fan_in.get(timeout=30)[2]
        stream.return_credit(stream.generation)  # the second fragment starts...
        wait_for(lambda: server.steps_sent >= 2 * length + 20, 30, "the second fragment")
        grpc_server.stop(0).wait(5)  # ...and the worker's host goes away in the middle
        items = [fan_in.get(timeout=15)]
        while not isinstance(items[-1], StreamFailure):
            items.append(fan_in.get(timeout=15))
        # Whatever was unfinished is counted, never delivered half: every fragment that
        # arrived is whole, and the steps that did not make one are in env_steps_lost.
        assert first.sequence == 0 and first.arrays.rewards.shape == (length, 3)
        assert len(items) == 1 and stream.fragments_received == 1
        assert 0 < stream.env_steps_lost < 3 * length
    finally:
        stream.stop("done", timeout=5)
        inference.close()
        server.close()


def test_the_env_server_runs_without_torch(tmp_path) -> None:
    """An env host in central mode needs no torch: build and step an env server in a
    process where importing torch fails."""
    code = """
import sys
sys.modules["torch"] = None  # any import of torch now raises ImportError
import numpy as np
from hetrl.rollout.env_server import EnvServer
from hetrl.rollout.settings import WorkerSettings
server = EnvServer(WorkerSettings(env="CartPole-v1", envs_per_worker=4, inference="central"))
obs = server.groups[0].reset(seed=1)
result = server.groups[0].step(np.zeros(2, dtype=np.int64))
assert result.observations.shape == (2, 4)
print("ok", len(server.groups))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "2"]


def test_inference_batches_the_requests_that_wait() -> None:
    """Requests submitted while a pass runs are answered together in the next one."""
    settings = WorkerSettings(env="CartPole-v1")
    envs = make_vector_env(settings, 1, "sync")
    inference, _ = inference_for_envs(envs, settings)
    answered = threading.Semaphore(0)
    obs = np.zeros((2, 4), np.float32)
    inference._weights_lock.acquire()  # hold the next pass until all are queued
    try:
        for _ in range(6):
            inference.submit(obs, lambda *args: answered.release())
        time.sleep(0.1)
    finally:
        inference._weights_lock.release()
    for _ in range(6):
        assert answered.acquire(timeout=10)
    assert inference.passes <= 2 and inference.rows == 12
    inference.close()


def test_hetrl_worker_with_central_inference_serves_env_steps(tmp_path) -> None:
    """`hetrl worker --inference central` (an env host run by hand) is an env server."""
    import json
    import signal

    from tests.helpers import hetrl

    ready = tmp_path / "ready.json"
    proc = hetrl("worker", "--env", "CartPole-v1", "--inference", "central",
                 "--envs-per-worker", "4", "--ready-file", str(ready),
                 env={"HETRL_TOKEN": TOKEN})
    try:
        wait_for(ready.exists, 60, "the env server to listen")
        address = json.loads(ready.read_text())["address"]
        requests: queue.Queue = queue.Queue()
        responses = _raw_stream(address, iter(requests.get, None))
        hello = next(responses).hello
        assert (hello.inference, hello.env_groups, hello.num_envs) == ("central", 2, 4)
        assert next(responses).env_step.observations.shape == [2, 4]
        requests.put(hetrl_pb2.LearnerMessage(stop=hetrl_pb2.Stop(reason="test over")))
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, output
        assert "env server 0 stopped (learner: test over)" in output
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
