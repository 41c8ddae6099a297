"""An env host of a cluster job: rollout workers on known ports, a control service, and
a dead-man's switch.

The host starts one worker process per usable core (or as configured) on its cluster
address, and serves HostControl beside them: the learner host asks it which workers it
runs (Describe), proves it is alive (Heartbeat), and ends it (Stop). The host exits 0
after a Stop or SIGTERM, having stopped its workers. It exits non-zero, with the reason
in `<base>/output/failure`, when no learner heartbeat arrives within the startup
timeout, when heartbeats stop for longer than the loss timeout, or when a worker keeps
crashing (or reports an env that keeps failing), so no env host can keep a job billing
after its learner is gone. A standard gRPC health service on the control port reports
each worker ("hetrl.worker.<i>") NOT_SERVING from its exit until its restart listens.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import psutil
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from hetrl.launch.cluster import ClusterView, host_order, resolve, usable_cores
from hetrl.launch.processes import child_environment
from hetrl.launch.settings import ClusterSettings
from hetrl.launch.supervisor import Supervisor
from hetrl.protos import hetrl_pb2, hetrl_pb2_grpc
from hetrl.rollout.errors import ChildFailedError
from hetrl.rollout.exits import EXIT_FAILED, EXIT_OK
from hetrl.rollout.lifetime import early_stop
from hetrl.rollout.settings import WorkerSettings, pick
from hetrl.rollout.transport import create_server, transport_options

log = logging.getLogger("hetrl.env_host")

SERVING, NOT_SERVING = (health_pb2.HealthCheckResponse.SERVING,
                        health_pb2.HealthCheckResponse.NOT_SERVING)


def _listening(address: str, port: int) -> bool:
    """Whether something accepts TCP connections on address:port (a restarted worker)."""
    try:
        with socket.create_connection((address, port), timeout=0.2):
            return True
    except OSError:
        return False


# Control requests are a few bytes; anything near this is not one.
CONTROL_RECEIVE_BYTES = 64 << 10


class HostControl(hetrl_pb2_grpc.HostControlServicer):
    """The learner host's handle on this host."""

    def __init__(self, host: str, addresses: list[str], cores: int) -> None:
        self.info = hetrl_pb2.HostInfo(host=host, worker_addresses=addresses, cores=cores)
        self.messages_malformed = 0
        self.first_heartbeat: float | None = None
        self.last_heartbeat: float | None = None
        self.stop_reason: str | None = None
        self.changed = threading.Event()
        self.workers_running: Callable[[], int] = lambda: 0

    def _alive(self) -> None:
        now = time.monotonic()
        self.first_heartbeat = self.first_heartbeat or now
        self.last_heartbeat = now

    def Describe(self, request, context):
        self._alive()
        return self.info

    def Heartbeat(self, request, context):
        self._alive()
        return hetrl_pb2.HeartbeatReply(
            cpu_percent=psutil.cpu_percent(interval=None),
            memory_percent=psutil.virtual_memory().percent,
            workers_running=self.workers_running(),
        )

    def Stop(self, request, context):
        log.info("stop requested by the learner host: %s", request.reason or "no reason")
        self.stop_reason = self.stop_reason or request.reason or "stop"  # the first one counts
        self.changed.set()
        return hetrl_pb2.StopReply(accepted=True)


def add_control_to_server(control: HostControl, server: grpc.Server) -> None:
    """Serve `control` as hetrl.HostControl. Requests arrive as bytes and are parsed here,
    so bytes that are not the request are answered INVALID_ARGUMENT and counted
    (grpcio's own deserializer would answer INTERNAL and log a traceback)."""
    methods: dict[str, tuple[type[Message], type[Message]]] = {
               "Describe": (hetrl_pb2.DescribeRequest, hetrl_pb2.HostInfo),
               "Heartbeat": (hetrl_pb2.HeartbeatRequest, hetrl_pb2.HeartbeatReply),
               "Stop": (hetrl_pb2.StopRequest, hetrl_pb2.StopReply)}

    def parsing(name: str, request_type):
        method = getattr(control, name)

        def handle(raw: bytes, context):
            try:
                request = request_type.FromString(raw)
            except DecodeError as exc:
                control.messages_malformed += 1
                log.error("malformed %s request from %s refused (%d so far): %s", name,
                          context.peer(), control.messages_malformed, exc)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"malformed {request_type.__name__}")
            return method(request, context)

        return handle

    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            parsing(name, request_type), request_deserializer=None,
            response_serializer=reply_type.SerializeToString)
        for name, (request_type, reply_type) in methods.items()
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("hetrl.HostControl", handlers),))


class WorkerHealth:
    """The standard gRPC health of this host's workers: "hetrl.worker.<i>", and "" for
    them all, are NOT_SERVING from a worker's exit until its restart listens."""

    def __init__(self, address: str, ports: list[int]) -> None:
        self.servicer = health.HealthServicer()
        self.address, self.ports = address, ports
        self.restarting: set[int] = set()
        self.servicer.set("", SERVING)
        for i in range(len(ports)):
            self.servicer.set(f"hetrl.worker.{i}", SERVING)

    def restarted(self, index: int) -> None:
        self.servicer.set(f"hetrl.worker.{index}", NOT_SERVING)
        self.servicer.set("", NOT_SERVING)
        self.restarting.add(index)

    def failing(self) -> None:
        """The host is failing and stops every worker."""
        for i in range(len(self.ports)):
            self.servicer.set(f"hetrl.worker.{i}", NOT_SERVING)
        self.servicer.set("", NOT_SERVING)

    def follow(self) -> None:
        """Back to SERVING for each restarted worker that listens again."""
        for i in sorted(self.restarting):
            if _listening(self.address, self.ports[i]):
                self.restarting.discard(i)
                self.servicer.set(f"hetrl.worker.{i}", SERVING)
                if not self.restarting:
                    self.servicer.set("", SERVING)


def run_env_host(settings: ClusterSettings, cluster: ClusterView, token: str) -> int:
    """Serve until the learner host stops this host; return the exit code."""
    host = cluster.current_host
    address = resolve(host, settings.resolve_timeout)
    count = settings.workers_per_env_host or usable_cores()
    ports = [settings.worker_base_port + i for i in range(count)]
    control = HostControl(host, [f"{address}:{port}" for port in ports], usable_cores())

    def on_signal(signum, _frame):
        control.stop_reason = f"signal {signal.Signals(signum).name}"
        control.changed.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    control.stop_reason = early_stop()  # set if the job stopped while this host started
    started = time.monotonic()
    workers = Supervisor(
        lambda i, port, ready: pick(
            WorkerSettings, settings, worker_id=_worker_id(cluster, i), host=address,
            port=port, ready_file=ready,
            learner_timeout=settings.first_heartbeat_timeout + settings.loss_timeout),
        cluster.base_dir / "hetrl", child_environment(token), echo_host=host, say=log.error)
    workers.start(ports)  # forked before this process creates any gRPC threads
    control.workers_running = workers.running
    health_status = WorkerHealth(address, ports)
    failure: str | None = None
    server = None
    try:
        options = dataclasses.replace(transport_options(settings),
                                      max_receive_bytes=CONTROL_RECEIVE_BYTES)
        server, _ = create_server(f"{address}:{settings.control_port}", token, options=options)
        add_control_to_server(control, server)
        health_pb2_grpc.add_HealthServicer_to_server(health_status.servicer, server)
        server.start()
        log.info("env host %s: %d workers on %s, control on %s:%d", host, count,
                 address, address, settings.control_port)
        while control.stop_reason is None and failure is None:
            control.changed.wait(0.5)
            failure = _learner_lost(control, settings, started)
            health_status.follow()
            if failure is None:
                try:
                    for i in workers.poll():
                        health_status.restarted(i)
                except ChildFailedError as exc:
                    health_status.failing()
                    failure = f"env host {host}: {exc}"
    finally:
        workers.stop(min(settings.stop_budget / 2, 30.0))
        if server is not None:
            server.stop(grace=1.0).wait(5.0)
    if failure:
        log.error("%s", failure)
        write_failure(cluster, failure)
        return EXIT_FAILED
    log.info("env host %s stopped: %s", host, control.stop_reason)
    return EXIT_OK


def _learner_lost(control: HostControl, settings: ClusterSettings, started: float) -> str | None:
    """Why this host must fail for want of a learner (its dead-man's switch), or None."""
    now, host = time.monotonic(), control.info.host
    if control.first_heartbeat is None and now - started > settings.first_heartbeat_timeout:
        return (f"env host {host}: no learner connected within "
                f"{settings.first_heartbeat_timeout:.0f} s (first_heartbeat_timeout)")
    if control.last_heartbeat is not None and now - control.last_heartbeat > settings.loss_timeout:
        return (f"env host {host}: learner gone for {now - control.last_heartbeat:.0f} s "
                f"(loss_timeout {settings.loss_timeout:.0f} s)")
    return None


def _worker_id(cluster: ClusterView, index: int) -> int:
    """A job-wide unique worker id (and so its seeds): this host's position among all the
    job's hosts in natural name order, times 1000, plus the worker's index. Every host
    agrees on it whatever order its resourceconfig.json lists groups and hosts in (the
    order is not the same on every host: position in the list gave two hosts the same
    ids, seeds and experience)."""
    hosts = sorted({h for group in cluster.groups.values() for h in group}, key=host_order)
    position = hosts.index(cluster.current_host) if cluster.current_host in hosts else 0
    return position * 1000 + index


def write_failure(cluster: ClusterView, reason: str) -> None:
    """Write the reason SageMaker shows as the job's FailureReason."""
    path: Path = cluster.failure_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason[:1000])
