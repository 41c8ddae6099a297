"""Bad input 10, 11, 12, 14 and the gRPC settings: oversized and malformed messages,
non-finite weights, health, keepalive values, and no pickle in the product. Real gRPC
servers on loopback, in this process."""

from __future__ import annotations

import queue
import re
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hetrl.learner.connections import WorkerStream, fan_in_bound
from hetrl.protos import hetrl_pb2, hetrl_pb2_grpc
from hetrl.rollout import wire
from hetrl.rollout.errors import ConfigError
from hetrl.rollout.settings import WorkerSettings
from hetrl.rollout.transport import (
    DEFAULT_OPTIONS,
    TransportOptions,
    auth_metadata,
    create_channel,
    create_server,
)
from hetrl.rollout.worker import RolloutWorker, add_to_server
from tests.helpers import wait_for
from tests.learner.test_stream import make_spec, weights_message

TOKEN = "test-token"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_limit_worker():
    """A worker served with a 1 MiB message limit."""
    settings = WorkerSettings(env="CartPole-v1", envs_per_worker=2, fragment_length=4)
    worker = RolloutWorker(settings)
    options = TransportOptions(max_message_bytes=1 << 20)
    server, port = create_server("127.0.0.1:0", TOKEN, options=options)
    add_to_server(worker, server)
    health_pb2_grpc.add_HealthServicer_to_server(worker.health, server)
    server.start()
    yield worker, f"127.0.0.1:{port}", settings, options
    worker.request_stop("test over")
    server.stop(0).wait(5)
    worker.close()


def held_open(messages, seconds: float = 10.0):
    """Yield the messages, then keep the request side open (a learner does not
    half-close its stream), so the worker acts on them instead of seeing the end."""
    yield from messages
    time.sleep(seconds)


def raw_stream(address: str, messages, send_limit: int = 64 << 20):
    channel = grpc.insecure_channel(address, options=[
        ("grpc.max_send_message_length", send_limit)])
    stub = hetrl_pb2_grpc.RolloutStub(channel)
    return stub.Stream(held_open(messages), metadata=auth_metadata(TOKEN), timeout=10)


def good_stream_works(worker, address, settings, options) -> None:
    fan_in: queue.Queue = queue.Queue()
    stream = WorkerStream(address, TOKEN, make_spec(worker), fan_in,
                          weights_message(worker, settings, 3), credits=1,
                          connect_timeout=10, options=options)
    stream.start()
    item = fan_in.get(timeout=20)
    assert item[2].policy_version == 3
    stream.stop("done", timeout=10)


def test_limits_are_equal_on_both_ends() -> None:
    server = dict(DEFAULT_OPTIONS.server_options())
    client = dict(DEFAULT_OPTIONS.channel_options())
    for key in ("grpc.max_send_message_length", "grpc.max_receive_message_length"):
        assert server[key] == client[key] == DEFAULT_OPTIONS.max_message_bytes


def test_fragment_over_the_limit_is_refused_at_start() -> None:
    settings = WorkerSettings(env="CartPole-v1", envs_per_worker=200, fragment_length=100_000)
    with pytest.raises(ConfigError, match="message limit: lower --fragment-length"):
        RolloutWorker(settings)


def test_oversized_message_gets_resource_exhausted_and_server_serves_on(
    small_limit_worker,
) -> None:
    worker, address, settings, options = small_limit_worker
    big = hetrl_pb2.Weights(version=1, arrays=wire.encode_named(
        {"x": np.zeros(2 << 20, np.uint8)}))
    responses = raw_stream(address, [hetrl_pb2.LearnerMessage(weights=big)])
    with pytest.raises(grpc.RpcError) as info:
        list(responses)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    wait_for(lambda: worker.state.value == "idle", 10, "the worker to be free again")
    good_stream_works(worker, address, settings, options)


@pytest.mark.parametrize("arrays", [
    [hetrl_pb2.NamedArray(name="x", array=hetrl_pb2.NDArray(dtype="|O", shape=[1], data=b"1"))],
    [hetrl_pb2.NamedArray(name="x", array=hetrl_pb2.NDArray(dtype="<f4", shape=[-1], data=b""))],
    [hetrl_pb2.NamedArray(name="x", array=hetrl_pb2.NDArray(dtype="<f4", shape=[3], data=b"12"))],
    [hetrl_pb2.NamedArray(name="x", array=hetrl_pb2.NDArray(dtype="<f4", shape=[1 << 40],
                                                            data=b""))],
    [],  # wrong field count: weights that do not fit the policy
], ids=["object-dtype", "negative-dim", "size-mismatch", "huge-dim", "missing-fields"])
def test_malformed_weights_get_invalid_argument_and_are_counted(
    small_limit_worker, arrays
) -> None:
    worker, address, settings, options = small_limit_worker
    weights = hetrl_pb2.Weights(version=1, arrays=arrays)
    responses = raw_stream(address, [
        hetrl_pb2.LearnerMessage(weights=weights),
        hetrl_pb2.LearnerMessage(credits=hetrl_pb2.Credits(count=1)),
    ])
    with pytest.raises(grpc.RpcError) as info:
        for message in responses:
            assert message.WhichOneof("kind") == "hello"
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert worker.messages_malformed == 1
    wait_for(lambda: worker.state.value == "idle", 10, "the worker to be free again")
    good_stream_works(worker, address, settings, options)


@pytest.mark.parametrize("raw", [b"\xff\xff\xff\xff", b"\x0a\xff\x01", bytes(range(256))])
def test_bytes_that_do_not_parse_get_invalid_argument(small_limit_worker, raw: bytes) -> None:
    worker, address, settings, options = small_limit_worker
    channel = grpc.insecure_channel(address)
    stream = channel.stream_stream("/hetrl.Rollout/Stream", request_serializer=None,
                                   response_deserializer=None)
    responses = stream(held_open([raw]), metadata=auth_metadata(TOKEN), timeout=10)
    with pytest.raises(grpc.RpcError) as info:
        for message in responses:  # the Hello comes first, then the refusal
            assert hetrl_pb2.WorkerMessage.FromString(message).WhichOneof("kind") == "hello"
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert worker.messages_malformed == 1
    wait_for(lambda: worker.state.value == "idle", 10, "the worker to be free again")
    good_stream_works(worker, address, settings, options)


def test_nonfinite_weights_are_dropped_and_counted(small_limit_worker) -> None:
    worker, address, settings, options = small_limit_worker
    weights = weights_message(worker, settings, 5)
    for item in weights.arrays:
        if item.array.dtype == "<f4":
            bad = wire.decode(item.array).copy()
            bad.flat[0] = np.nan
            item.array.CopyFrom(wire.encode(bad))
            break
    fan_in: queue.Queue = queue.Queue()
    stream = WorkerStream(address, TOKEN, make_spec(worker), fan_in, weights, credits=1,
                          connect_timeout=10, options=options)
    stream.start()
    wait_for(lambda: worker.weights_nonfinite == 1, 10, "the NaN weights to be refused")
    assert fan_in.empty()  # nothing sampled with them
    stream.push_weights(weights_message(worker, settings, 6))
    assert fan_in.get(timeout=20)[2].policy_version == 6
    stream.stop("done", timeout=10)


def test_health_reports_serving_then_not_serving(small_limit_worker) -> None:
    worker, address, *_ = small_limit_worker
    stub = health_pb2_grpc.HealthStub(create_channel(address))
    ask = lambda: stub.Check(health_pb2.HealthCheckRequest(service="hetrl.Rollout"),  # noqa: E731
                             metadata=auth_metadata(TOKEN), timeout=5).status
    assert ask() == health_pb2.HealthCheckResponse.SERVING
    worker.request_stop("test")
    assert ask() == health_pb2.HealthCheckResponse.NOT_SERVING


def test_keepalive_is_accepted_by_the_server_and_configurable() -> None:
    options = TransportOptions(keepalive_time=2.0, keepalive_timeout=1.5)
    client, server = dict(options.channel_options()), dict(options.server_options())
    assert client["grpc.keepalive_time_ms"] == 2000
    assert client["grpc.keepalive_timeout_ms"] == 1500
    assert client["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.http2.min_recv_ping_interval_without_data_ms"] <= 2000
    assert client["grpc.max_reconnect_backoff_ms"] <= 2000  # bounded backoff
    assert fan_in_bound(4, 2) == 20  # the learner's queue has an explicit bound


def test_no_pickle_or_unsafe_torch_load_in_the_product() -> None:
    offenders = []
    for package in ("protos", "rollout", "learner", "launch"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            for n, line in enumerate(text.splitlines(), 1):
                code = line.split("#", 1)[0]
                if re.search(r"\b(c?pickle|dill|cloudpickle|marshal|shelve)\b", code) and \
                        re.search(r"\bimport\b|\.loads?\(", code):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
            for match in re.finditer(r"torch\.load\((?:[^()]|\([^()]*\))*\)", text):
                if "weights_only=True" not in match.group(0):
                    offenders.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert offenders == [], "pickle-based loading in the product:\n" + "\n".join(offenders)


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


def test_a_worker_refuses_more_than_one_set_of_weights_before_buffering_it(
        measured, tmp_path: Path) -> None:
    """100 MiB of garbage with the right token: a worker's receive limit is one set of
    its weights (KiB here), so gRPC refuses it unread; it used to be 256 MiB for every
    peer, and a 200 MiB message grew a worker's RSS from 252 to 469 MiB for good."""
    import json
    import os
    import subprocess
    import sys

    from hetrl.rollout.settings import to_json

    ready = tmp_path / "ready.json"
    settings = WorkerSettings(env="CartPole-v1", envs_per_worker=2, fragment_length=4,
                              ready_file=str(ready))
    (tmp_path / "worker.json").write_text(to_json(settings))
    proc = subprocess.Popen([sys.executable, "-m", "hetrl.rollout.worker",
                             str(tmp_path / "worker.json")], cwd=ROOT,
                            env=dict(os.environ, HETRL_TOKEN=TOKEN),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(ready.exists, 60, "the worker to listen")
        address = json.loads(ready.read_text())["address"]
        before = _rss_mib(proc.pid)
        channel = grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", 256 << 20)])
        stream = channel.stream_stream("/hetrl.Rollout/Stream", request_serializer=None,
                                       response_deserializer=None)
        garbage = b"\xff" * (100 << 20)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            list(stream(held_open([garbage], 30), metadata=auth_metadata(TOKEN), timeout=30))
        refused = time.monotonic() - started
        del garbage
        after = _rss_mib(proc.pid)
        measured(f"100 MiB of garbage to a worker: {info.value.code().name} after "
              f"{refused:.2f} s; worker RSS {before:.0f} -> {after:.0f} MiB")
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
        assert after - before < 20
        assert proc.poll() is None  # still serving
    finally:
        proc.terminate()
        proc.wait(30)


def test_garbage_to_an_env_host_control_port_is_invalid_argument_and_counted(caplog) -> None:
    from hetrl.launch.env_host import HostControl, add_control_to_server

    control = HostControl("algo-1", ["127.0.0.1:1"], 2)
    server, port = create_server("127.0.0.1:0", TOKEN)
    add_control_to_server(control, server)
    server.start()
    try:
        channel = create_channel(f"127.0.0.1:{port}")
        for method in ("Describe", "Heartbeat", "Stop"):
            call = channel.unary_unary(f"/hetrl.HostControl/{method}",
                                       request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as info:
                call(b"\xff" * 64, metadata=auth_metadata(TOKEN), timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert control.messages_malformed == 3 and control.stop_reason is None
        assert "Traceback" not in caplog.text
        stub = hetrl_pb2_grpc.HostControlStub(channel)  # well-formed calls still work
        info = stub.Describe(hetrl_pb2.DescribeRequest(), metadata=auth_metadata(TOKEN),
                             timeout=5)
        assert info.host == "algo-1"
    finally:
        server.stop(0)
