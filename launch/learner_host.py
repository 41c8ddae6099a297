"""The learner host of a cluster job: find every env host's workers, train, and make
sure every env host stops afterwards, whatever happened.

It also runs rollout workers on its own spare cores (loopback only), as AWS's example ran
data workers on its GPU hosts. A heartbeat thread keeps every env host's dead-man's
switch satisfied while the learner lives. At the end (success, failure or SIGTERM) the
learner checkpoints, then an authenticated Stop goes to every env host, retried with
backoff within the stop budget. Failures are written to `<base>/output/failure`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from hetrl.launch.cluster import ClusterView, host_order, resolve, usable_cores
from hetrl.launch.env_host import write_failure
from hetrl.launch.evaluator import finish_evaluations, start_evaluator
from hetrl.launch.processes import Child, child_environment, spawn, stop_all
from hetrl.launch.settings import ClusterSettings
from hetrl.launch.supervisor import Supervisor
from hetrl.learner.learner import Learner
from hetrl.learner.settings import LearnerSettings
from hetrl.protos import hetrl_pb2, hetrl_pb2_grpc
from hetrl.rollout.errors import ChildFailedError, ConfigError, HetrlError
from hetrl.rollout.exits import EXIT_FAILED, EXIT_OK
from hetrl.rollout.lifetime import early_stop
from hetrl.rollout.settings import WorkerSettings, pick
from hetrl.rollout.transport import auth_metadata, create_channel, transport_options

log = logging.getLogger("hetrl.learner_host")

RPC_DEADLINE = 5.0


class EnvHosts:
    """Control channels to every env host: describe, heartbeat, stop."""

    def __init__(self, hosts: list[str], settings: ClusterSettings, token: str) -> None:
        self.hosts, self.settings = hosts, settings
        self.metadata = auth_metadata(token)
        self.stubs: dict[str, hetrl_pb2_grpc.HostControlStub] = {}
        self._stop_heartbeats = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self.load: dict[str, hetrl_pb2.HeartbeatReply] = {}  # newest reply per host
        self.silent_since: dict[str, float] = {}  # first failed heartbeat since the last answer
        self._interval = max(0.2, min(5.0, settings.loss_timeout / 4))

    def _stub(self, host: str) -> hetrl_pb2_grpc.HostControlStub:
        if host not in self.stubs:
            address = resolve(host, self.settings.resolve_timeout)
            channel = create_channel(f"{address}:{self.settings.control_port}",
                                     transport_options(self.settings))
            self.stubs[host] = hetrl_pb2_grpc.HostControlStub(channel)
        return self.stubs[host]

    def describe_all(self) -> list[str]:
        """Every worker address of every env host (retrying until resolve_timeout)."""
        if not self.hosts:
            return []
        with ThreadPoolExecutor(len(self.hosts), thread_name_prefix="describe") as pool:
            infos = list(pool.map(self._describe, self.hosts))
        return [a for info in infos for a in info.worker_addresses]

    def _describe(self, host: str) -> hetrl_pb2.HostInfo:
        deadline = time.monotonic() + self.settings.resolve_timeout
        delay = 0.2
        while True:
            try:
                info = self._stub(host).Describe(
                    hetrl_pb2.DescribeRequest(), metadata=self.metadata, timeout=RPC_DEADLINE,
                    wait_for_ready=True,
                )
                log.info("env host %s runs %d workers", host, len(info.worker_addresses))
                return info
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    raise ConfigError(f"env host {host} refused our token: is HETRL_TOKEN the "
                                      "same on every host?") from exc
                if time.monotonic() + delay > deadline:
                    raise ConfigError(
                        f"env host {host} did not answer within {self.settings.resolve_timeout:.0f}"
                        f" s (resolve_timeout): {exc.code().name}"
                    ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def start_heartbeats(self) -> None:
        interval = self._interval

        def beat() -> None:
            while not self._stop_heartbeats.wait(interval):
                for host in self.hosts:
                    try:
                        self.load[host] = self._stub(host).Heartbeat(
                            hetrl_pb2.HeartbeatRequest(learner="learner"),
                            metadata=self.metadata, timeout=min(RPC_DEADLINE, interval),
                        )
                        self.silent_since.pop(host, None)
                    except (grpc.RpcError, HetrlError) as exc:
                        self.silent_since.setdefault(host, time.monotonic())
                        log.warning("heartbeat to %s failed: %s", host, exc)

        self._heartbeat_thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
        self._heartbeat_thread.start()

    def metrics(self) -> dict[str, float]:
        """CPU and memory of every env host, from the newest heartbeat replies."""
        out: dict[str, float] = {}
        for host, reply in list(self.load.items()):
            out[f"utilisation/env_host_cpu_percent/{host}"] = reply.cpu_percent
            out[f"utilisation/env_host_memory_percent/{host}"] = reply.memory_percent
        cpus = [r.cpu_percent for r in list(self.load.values())]
        if cpus:
            out["utilisation/env_hosts_cpu_percent"] = sum(cpus) / len(cpus)
        return out

    def _gone(self, host: str) -> bool:
        """True when the host answers but refuses connections to its control port: the
        env host process has exited (an unreachable host times out instead)."""
        try:
            address = resolve(host, 1.0)
            with socket.create_connection((address, self.settings.control_port), timeout=1.0):
                return False
        except ConnectionRefusedError:
            return True
        except (OSError, HetrlError):
            return False

    def stop_all(self, reason: str, budget: float) -> list[str]:
        """Stop every env host, retrying with backoff within `budget` s; return the
        hosts that never confirmed."""
        self._stop_heartbeats.set()
        deadline = time.monotonic() + budget

        def stop(host: str) -> str | None:
            delay = 0.2
            silent = time.monotonic() - self.silent_since.get(host, time.monotonic())
            while time.monotonic() < deadline:
                try:
                    self._stub(host).Stop(
                        hetrl_pb2.StopRequest(reason=reason), metadata=self.metadata,
                        timeout=min(RPC_DEADLINE, max(0.1, deadline - time.monotonic())),
                    )
                    return None
                except (grpc.RpcError, HetrlError) as exc:
                    if self._gone(host):
                        log.info("env host %s is gone (nothing listens on its control "
                                 "port): it stopped already", host)
                        return None
                    if silent > 3 * self._interval:
                        # Unanswered heartbeats for a while: most likely unreachable; its
                        # own dead-man's switch ends it.
                        log.warning("env host %s has not answered for %.0f s; not retrying "
                                    "its stop (%s)", host, silent, exc)
                        return host
                    log.warning("stop of %s failed (%s); retrying", host, exc)
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, 5.0)
            return host

        if not self.hosts:
            return []
        with ThreadPoolExecutor(len(self.hosts), thread_name_prefix="stop-host") as pool:
            return [h for h in pool.map(stop, self.hosts) if h is not None]


@dataclasses.dataclass(frozen=True)
class HostRanks:
    """This learner host's place in the learner group: its ranks and where they meet.

    Every learner host computes the same answer from the job's config: hosts in natural
    name order, `per_host` ranks each (one per GPU by default), rank 0 on the first,
    which is where the group meets (`rendezvous`, host:port)."""

    first: int
    per_host: int
    ranks: int
    rendezvous: str

    @property
    def leader(self) -> bool:
        """This host runs rank 0: it writes the run's outputs."""
        return self.first == 0


def host_ranks(settings: ClusterSettings, cluster: ClusterView) -> HostRanks:
    """This learner host's ranks.

    Raises:
        ConfigError: the learner group has no hosts, or not this one.
    """
    hosts = sorted(cluster.groups.get(settings.learner_group, []), key=host_order)
    if cluster.current_host not in hosts:
        raise ConfigError(f"learner group {settings.learner_group!r} lists hosts {hosts}, "
                          f"not this host {cluster.current_host!r}")
    per_host = settings.learners_per_host or max(1, cluster.num_gpus)
    ranks = per_host * len(hosts)
    rendezvous = (f"{resolve(hosts[0], settings.resolve_timeout)}:{settings.group_port}"
                  if ranks > 1 else "")
    return HostRanks(hosts.index(cluster.current_host) * per_host, per_host, ranks, rendezvous)


def run_learner_host(settings: ClusterSettings, cluster: ClusterView, token: str) -> int:
    """Train with every env host's workers; return the exit code. In a learner group,
    this host's first rank runs here and its others as child processes; every learner
    host stops every env host at its end (a Stop is idempotent)."""
    place = host_ranks(settings, cluster)
    if place.ranks > 1:
        # The ranks talk over the job's network interface (eth0; lo when emulated).
        for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if cluster.network_interface:
                os.environ.setdefault(variable, cluster.network_interface)
        here = (f"rank {place.first}" if place.per_host == 1 else
                f"ranks {place.first}-{place.first + place.per_host - 1}")
        log.info("learner group: %s of %d on this host, meeting at %s", here, place.ranks,
                 place.rendezvous)
    env_hosts = EnvHosts(cluster.hosts_of(settings.env_groups), settings, token)
    local = _local_workers(settings, cluster, token)
    evaluator: Child | None = None
    learner: Learner | None = None
    other_ranks: list[Child] = []
    stop_reason: list[str] = []
    stop_since: list[float] = []  # when a signal asked for the stop

    def on_signal(signum, _frame):
        stop_since.append(time.monotonic())
        stop_reason.append(f"signal {signal.Signals(signum).name}")
        if learner is not None:
            learner.request_stop(stop_reason[-1])

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if (early := early_stop()) is not None:  # the job stopped while this host started
        stop_since.append(time.monotonic())
        stop_reason.append(early)
    code, reason = EXIT_FAILED, "failed"
    watch_done = threading.Event()
    watcher: threading.Thread | None = None
    try:
        local_addresses = local.start_and_wait(_local_worker_count(settings),
                                               settings.resolve_timeout, "resolve_timeout")
        addresses = local_addresses + env_hosts.describe_all()
        if not addresses:
            raise ConfigError("no rollout workers: the env groups are empty and "
                              "learner_host_workers is 0")
        env_hosts.start_heartbeats()
        learner_settings = pick(LearnerSettings, settings, worker_addresses=tuple(addresses),
                                out=str(cluster.model_dir))
        if place.ranks > 1:
            # Env hosts' workers are shared out among all ranks; this host's own (on
            # loopback) among its own ranks.
            shared = tuple(a for a in addresses if a not in local_addresses)
            learner_settings = dataclasses.replace(
                learner_settings, worker_addresses=shared, learners=place.ranks,
                rendezvous=place.rendezvous, rank=place.first,
                own_worker_addresses=tuple(local_addresses[0 :: place.per_host]))
            other_ranks = _start_other_ranks(learner_settings, place, local_addresses,
                                             cluster, token)
        learner = Learner(learner_settings, token)
        learner.extra_metrics = env_hosts.metrics
        watcher = _supervise_local_workers(local, learner, watch_done)
        if settings.eval_every and place.leader:  # on spare CPU, beside the learner
            evaluator = start_evaluator(cluster.model_dir, settings.eval_episodes,
                                        settings.seed, cluster.base_dir / "hetrl",
                                        child_environment(token),
                                        deterministic=settings.eval_deterministic)
        _write_cluster_file(cluster, settings)
        if stop_reason:
            learner.request_stop(stop_reason[-1])
        log.info("learner connecting to %d workers (%d on this host)", len(addresses),
                 len(local_addresses))
        code = learner.run()
        reason = "training finished" if code == EXIT_OK else "learner failed"
        if code != EXIT_OK:
            write_failure(cluster, f"learner host {cluster.current_host}: learner failed; "
                          "see its log")
    except HetrlError as exc:
        log.error("%s", exc)
        write_failure(cluster, f"learner host {cluster.current_host}: {exc}")
        reason = f"learner host failed: {exc}"
    finally:
        watch_done.set()  # nothing restarts a local worker from here on
        if watcher is not None:
            watcher.join(5.0)
        _end_other_ranks(other_ranks, settings.stop_budget / 4)
        # A group that ended together: rank 0's host stops the env hosts once it has
        # saved (its workers stream to the end). A broken group or a failed host: every
        # learner host stops them, in case rank 0's host is the one that is gone.
        broken = learner is not None and learner.group is not None and learner.group.broken
        if place.leader or code != EXIT_OK or broken or learner is None:
            unconfirmed = env_hosts.stop_all(reason, settings.stop_budget / 2)
            if unconfirmed:
                log.error("env hosts %s did not confirm the stop; their dead-man's switch "
                          "ends them within loss_timeout", unconfirmed)
        local.stop(10.0)
        if evaluator is not None:
            if code == EXIT_OK and not stop_since:  # no stop deadline runs: play the last
                finish_evaluations(evaluator, cluster.model_dir, FINAL_EVALUATION_SECONDS)
            stop_all([evaluator], 5.0)
    if learner is not None and place.leader:
        keep_final_model(cluster.model_dir, learner.checkpoint_dir)
        spent = time.monotonic() - stop_since[0] if stop_since else 0.0
        if spent > settings.stop_budget / 2:
            log.warning("no run report: the stop has taken %.0f s of its %.0f s budget "
                        "(hetrl report on the downloaded output writes it)", spent,
                        settings.stop_budget)
        else:
            from hetrl.launch.report import try_write_report

            try_write_report(cluster.model_dir)
    return code


FINAL_MODEL = ("model.safetensors", "summary.json")
FINAL_EVALUATION_SECONDS = 60.0
"""How long a job that ended by itself waits for the evaluation of its final policy."""


def keep_final_model(model_dir: Path, checkpoint_dir: Path) -> None:
    """Copy the final model beside the checkpoints (<checkpoint_dir>/final/), which
    SageMaker syncs with S3 as it goes: a stopped, interrupted or restarted job finds it
    there even where /opt/ml/model (uploaded only at the job's end) never reached S3."""
    final = checkpoint_dir / "final"
    try:
        final.mkdir(parents=True, exist_ok=True)
        for name in FINAL_MODEL:
            if (model_dir / name).exists():
                shutil.copyfile(model_dir / name, final / f"{name}.tmp")
                (final / f"{name}.tmp").replace(final / name)
    except OSError as exc:
        log.warning("could not keep the final model in %s: %s", final, exc)


def _write_cluster_file(cluster: ClusterView, settings: ClusterSettings) -> None:
    """Record the job's instance groups beside the model, so reports can price the run."""
    instances = [
        {"group": name, "instance_type": cluster.instance_types.get(name, ""),
         "count": len(hosts)}
        for name, hosts in cluster.groups.items()
        if name in settings.env_groups or name == settings.learner_group
    ]
    cluster.model_dir.mkdir(parents=True, exist_ok=True)
    (cluster.model_dir / "cluster.json").write_text(json.dumps({"instances": instances}))


def _start_other_ranks(first: LearnerSettings, place: HostRanks, local_addresses: list[str],
                       cluster: ClusterView, token: str) -> list[Child]:
    """This host's ranks after its first, as `python -m hetrl.learner.learner` children
    (each its own GPU); they stop with the group, which stops when this host's rank does."""
    children = []
    for index in range(1, place.per_host):
        rank = place.first + index
        settings = dataclasses.replace(
            first, rank=rank, own_worker_addresses=tuple(local_addresses[index :: place.per_host]))
        children.append(spawn(f"learner-rank{rank}", "hetrl.learner.learner", settings,
                              cluster.base_dir / "hetrl", child_environment(token),
                              echo=sys.stdout, echo_prefix=f"[rank {rank}] "))
    return children


def _end_other_ranks(children: list[Child], grace: float) -> None:
    """Give this host's other ranks `grace` s to end with the group (they save nothing:
    rank 0 does), then stop what is left."""
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("learner %s did not end with the group; stopping it", child.name)
    stop_all(children, 5.0)


def _supervise_local_workers(local: Supervisor, learner: Learner,
                             done: threading.Event) -> threading.Thread:
    """Restart this host's own workers under the same rules as every env host's, while
    the learner trains and until `done`; one that cannot live stops the run with its
    cause. The caller sets `done` and joins the thread before it stops the workers."""

    def training() -> bool:
        return learner.training and not done.is_set()

    def watch() -> None:
        while training():
            try:
                local.poll(may_restart=training)
            except ChildFailedError as exc:
                log.error("%s", exc)
                learner.request_stop(str(exc).splitlines()[0], failed=True)
                return
            done.wait(0.5)

    thread = threading.Thread(target=watch, name="local-workers", daemon=True)
    thread.start()
    return thread


def _local_workers(settings: ClusterSettings, cluster: ClusterView, token: str) -> Supervisor:
    """The rollout workers on this host's spare cores (loopback only), not yet started;
    restarted as every host's are while the learner trains (_supervise_local_workers)."""
    return Supervisor(
        lambda i, port, ready: pick(
            WorkerSettings, settings, worker_id=900_000 + i, host="127.0.0.1", port=port,
            ready_file=ready, learner_timeout=settings.resolve_timeout + settings.loss_timeout),
        cluster.base_dir / "hetrl", child_environment(token), name="local-worker",
        echo_host=cluster.current_host)


def _local_worker_count(settings: ClusterSettings) -> int:
    if settings.learner_host_workers < 0:
        return max(0, usable_cores() - settings.learner_cores)
    return settings.learner_host_workers
