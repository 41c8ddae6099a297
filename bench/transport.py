"""Benchmark 2, transport: payload bytes/s through one hetrl stream vs raw TCP on loopback.

A server child (pinned to one core) serves both sides: hetrl's gRPC server
(`rollout.transport.create_server`, token check included) whose Rollout.Stream sends
a fragment of the requested size for every credit, and a plain TCP socket that sends
length-prefixed messages of the same size back to back. The consumer (pinned to
another core) is hetrl's real receive path, `WorkerStream` + `fragments.from_message`,
returning credits at once (2 in flight, hetrl's default); the raw client `recv_into`s
a preallocated buffer and views it with numpy (zero copies: the ceiling). Rows per
size: `hetrl` encodes every fragment as a worker does (`fragments.serialize`, one copy
of each array), `pb-objects` builds it through protobuf objects (`fragments.to_message`
then `SerializeToString`, the encoder hetrl used before), `grpc` serializes one
prebuilt message each time (gRPC + protobuf only), `raw tcp`. The receive side is
hetrl's in every gRPC row.

The copy census times each step a fragment's bytes take from env to learner tensor
on one 16 MiB fragment and divides by one memcpy of the same bytes.
Run: `python -m bench.transport [--quick]`.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
import sys
import threading
import time

import grpc
import numpy as np
import tyro

from bench import census, common, harness
from hetrl.protos import hetrl_pb2, hetrl_pb2_grpc
from hetrl.rollout import fragments, wire
from hetrl.rollout.fragments import FragmentArrays

T_LEN, N_ENVS = 32, 8  # every test fragment is 32 steps x 8 envs; obs width sets the size
HEADER = struct.Struct("<Q")


@dataclasses.dataclass
class Settings:
    """Transport: hetrl stream vs raw TCP, and the copies a fragment makes."""

    sizes_kib: tuple[int, ...] = (64, 256, 1024, 4096, 16384)
    """Message sizes to send, KiB."""
    repeats: int = 5
    """Windows per size and transport (interleaved)."""
    seconds: float = 1.5
    """Length of each timed window."""
    credits: int = 2
    """Fragments in flight on the gRPC stream (hetrl's default)."""
    placement: str = "split"
    """split: server on one core, consumer on another; shared: unpinned."""
    quick: bool = False
    """A short smoke run."""
    plot: bool = True
    """Draw bench/results/transport.png (needs matplotlib)."""


def test_fragment(size: int) -> FragmentArrays:
    """A fragment of about `size` bytes (float32 observations of the needed width)."""
    width = max(1, size // ((T_LEN + 1) * N_ENVS * 4))
    rng = np.random.default_rng(0)
    step = (T_LEN, N_ENVS)
    return FragmentArrays(
        observations=rng.standard_normal((T_LEN + 1, N_ENVS, width), dtype=np.float32),
        actions=np.zeros(step, np.int64), rewards=np.ones(step, np.float32),
        terminated=np.zeros(step, bool), truncated=np.zeros(step, bool),
        logprobs=np.zeros(step, np.float32), valid=np.ones(step, bool),
        episode_returns=np.zeros(0, np.float32), episode_lengths=np.zeros(0, np.int64),
    )


def spec_for(size: int):
    from hetrl.learner.connections import StreamSpec
    from hetrl.rollout.observations import ObsLayout

    width = test_fragment(size).observations.shape[-1]
    return StreamSpec("bench-transport", f"Box({width})", "Discrete(2)",
                      ObsLayout.box((width,), np.float32), (), np.dtype(np.int64))


# -- server child ------------------------------------------------------------------------
MODES = {"grpc": 0, "hetrl": 1, "pb-objects": 2}


class BlastServicer(hetrl_pb2_grpc.RolloutServicer):
    """Rollout.Stream that sends one test fragment per credit, already serialized (the
    handler has no response serializer). The learner's first Weights message carries
    the request: an array "request" = [size, mode]."""

    def Stream(self, request_iterator, context):
        cond, state = threading.Condition(), {"credits": 0, "request": None, "done": False}

        def read() -> None:
            try:
                for message in request_iterator:
                    with cond:
                        if message.WhichOneof("kind") == "weights":
                            state["request"] = wire.decode_named(message.weights.arrays)
                        elif message.WhichOneof("kind") == "credits":
                            state["credits"] += message.credits.count
                        else:
                            state["done"] = True
                        cond.notify_all()
            finally:
                with cond:
                    state["done"] = True
                    cond.notify_all()

        threading.Thread(target=read, daemon=True).start()
        with cond:
            cond.wait_for(lambda: state["request"] is not None or state["done"], 30)
        if state["request"] is None:
            return
        size, mode = (int(v) for v in state["request"]["request"])
        arrays, spec = test_fragment(size), spec_for(size)
        yield hetrl_pb2.WorkerMessage(hello=hetrl_pb2.Hello(
            worker_id=0, incarnation="bench", num_envs=N_ENVS, fragment_length=T_LEN,
            env=spec.env, observation_space=spec.observation_space,
            action_space=spec.action_space)).SerializeToString()
        prebuilt = fragments.to_message(arrays, 0, "bench", 0, 0, 0.0)
        sequence = 0
        while True:
            with cond:
                while not (state["credits"] or state["done"]):
                    cond.wait(1.0)
                    if not context.is_active():
                        return
                if state["done"]:
                    return
                state["credits"] -= 1
            if mode == MODES["hetrl"]:
                yield fragments.serialize(arrays, 0, "bench", sequence, 0)
            elif mode == MODES["pb-objects"]:
                yield fragments.to_message(arrays, 0, "bench", sequence, 0, 0.0).SerializeToString()
            else:
                prebuilt.fragment.sequence = sequence
                yield prebuilt.SerializeToString()
            sequence += 1


def _raw_sender(conn: socket.socket) -> None:
    with conn:
        try:
            (size,) = HEADER.unpack(conn.recv(HEADER.size, socket.MSG_WAITALL))
            payload = HEADER.pack(size) + bytes(size)
            while True:
                conn.sendall(payload)
        except OSError:
            return


def serve() -> int:
    """Child: serve gRPC and raw TCP until stdin closes; print the ports first."""
    from hetrl.rollout.lifetime import die_with_parent
    from hetrl.rollout.transport import create_server

    die_with_parent()  # first: no child outlives the benchmark
    token = sys.stdin.readline().strip()
    server, grpc_port = create_server("127.0.0.1:0", token)
    handler = grpc.stream_stream_rpc_method_handler(
        BlastServicer().Stream, request_deserializer=hetrl_pb2.LearnerMessage.FromString,
        response_serializer=None)  # the servicer yields serialized bytes
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "hetrl.Rollout", {"Stream": handler}),))
    server.start()
    listener = socket.create_server(("127.0.0.1", 0))
    print(json.dumps({"grpc": grpc_port, "raw": listener.getsockname()[1]}), flush=True)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_raw_sender, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()  # until the parent closes the pipe
    server.stop(0)
    return 0


# -- consumer side ---------------------------------------------------------------------------
def raw_window(port: int, size: int, seconds: float, min_intervals: int = 4) -> float:
    """Payload bytes/s of back-to-back raw TCP messages into one reused buffer."""
    buffer = memoryview(bytearray(size))
    header = bytearray(HEADER.size)
    times = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(HEADER.pack(size))
        while True:
            sock.recv_into(header, HEADER.size, socket.MSG_WAITALL)
            got = 0
            while got < size:
                got += sock.recv_into(buffer[got:], size - got)
            np.frombuffer(buffer, np.uint8)
            times.append(time.perf_counter())
            if len(times) - 1 >= min_intervals and times[-1] - times[0] >= seconds:
                break
    return (len(times) - 1) * size / (times[-1] - times[0])


def grpc_consumer(port: int, token: str, size: int, mode: str) -> harness.Consumer:
    request = {"request": np.array([size, MODES[mode]], dtype=np.int64)}
    return harness.Consumer(f"127.0.0.1:{port}", token, spec_for(size),
                            harness.weights_message(request))


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, sizes_kib=(64, 1024), repeats=1, seconds=0.3)
    sample = test_fragment(1 << 20)
    assert hetrl_pb2.WorkerMessage.FromString(fragments.serialize(sample, 0, "b", 1, 2)) == \
        fragments.to_message(sample, 0, "b", 1, 2, 0.0), "fragments.serialize disagrees"
    producer, consumer_cpus = harness.placement(s.placement)
    harness.pin_this_process(consumer_cpus)
    from hetrl.rollout.transport import new_token

    token = new_token()
    child = harness.spawn(["-m", "bench.transport", "serve"], producer, "transport-server",
                          pipe=True)
    child.stdin.write(token + "\n")
    child.stdin.flush()
    ports = json.loads(child.stdout.readline())
    rows, results = [], []
    try:
        for kib in s.sizes_kib:
            size = kib * 1024
            consumers = {mode: grpc_consumer(ports["grpc"], token, size, mode) for mode in MODES}
            for c in consumers.values():
                c.window(0.2, 2, s.credits)  # warm-up
            order = ["raw tcp", *MODES]
            rates: dict[str, list[float]] = {name: [] for name in order}
            for i in range(s.repeats):
                for name in order[i % 4:] + order[: i % 4]:
                    if name == "raw tcp":
                        rates[name].append(raw_window(ports["raw"], size, s.seconds))
                    else:
                        w = consumers[name].window(s.seconds, credits=s.credits)
                        rates[name].append(w.bytes_per_s)
            for c in consumers.values():
                c.close()
            raw = rates["raw tcp"]
            entry = {"size_kib": kib}
            for name, values in rates.items():
                entry[name] = common.summarize([v / 2**20 for v in values])
                entry[f"{name} / raw"] = common.summarize(
                    [v / r for v, r in zip(values, raw, strict=True)])
            results.append(entry)
            target = 0.5 if kib >= 1024 else None
            rows.append([f"{kib:,} KiB", common.fmt(entry["raw tcp"]), common.fmt(entry["grpc"]),
                         common.fmt(entry["hetrl"]), common.fmt(entry["pb-objects"]),
                         common.fmt(entry["grpc / raw"], ".2f"),
                         common.fmt(entry["hetrl / raw"], ".2f"),
                         common.fmt(entry["pb-objects / raw"], ".2f"),
                         "-" if target is None else f">= {target} " + common.verdict(
                             entry["hetrl / raw"]["median"], target)])
            print(f"  {kib} KiB done", flush=True)
    finally:
        child.stdin.close()
        harness.stop(child)
    common.print_table(
        f"Transport: payload MiB/s through one stream, loopback (placement {s.placement}; "
        f"median [min-max] of {s.repeats})",
        ["message", "raw tcp MiB/s", "grpc MiB/s", "hetrl MiB/s", "pb-objects MiB/s",
         "grpc/raw", "hetrl/raw", "pb-objects/raw", "target"], rows)
    copies = census.run(quick=s.quick)
    common.write_json("transport", s, {"sizes": results, "copy_census": copies})

    def draw(plt) -> None:
        xs = [r["size_kib"] for r in results]
        for name in ("raw tcp", *MODES):
            common.errorbar(plt, xs, [r[name] for r in results], name)
        plt.xscale("log", base=2)
        plt.yscale("log")
        plt.xlabel("message size (KiB)")
        plt.ylabel("payload MiB/s, one stream, loopback")
        plt.legend()

    common.plot(common.stem("transport", s), draw, s.plot)
    return {"sizes": results, "copy_census": copies}


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        raise SystemExit(serve())
    main()
