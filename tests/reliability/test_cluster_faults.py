"""Faults 4, 5, 6 and 8 on an emulated heterogeneous cluster: every host is a real
`python -m hetrl.launch.host` process with its own SageMaker tree and loopback address. An env
host frozen with SIGSTOP (host and workers), the learner host SIGKILLed and started
again on its tree, hosts started late both ways, SIGTERM to one host at a time, and the
env host's health service around a worker restart. Each test prints what it measured;
docs/reliability.md quotes the figures."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
import torch

from hetrl.launch.cluster import HOST_MAP_ENV
from hetrl.launch.emulate import (
    EmulatedCluster,
    EmulateSettings,
    collect_result,
    prepare_hosts,
    start_host,
    start_hosts,
)
from hetrl.launch.processes import stop_all
from hetrl.learner.checkpoint import checkpoints
from tests.helpers import wait_for
from tests.reliability.cluster import (
    NOT_SERVING,
    SERVING,
    address_of,
    count,
    health,
    learner_step,
    steps_logged,
    worker_pids,
)


def settings(out: Path, **fields) -> EmulateSettings:
    return EmulateSettings(out=str(out), progress=False, **fields)


def wait_all_exit(cluster: EmulatedCluster, timeout: float) -> None:
    wait_for(lambda: all(c.exit_code() is not None for c in cluster.hosts.values()), timeout,
             "every host to exit")


def streaming(log: Path, address: str) -> int:
    return count(log, rf"streaming from worker \d+ at {address}:")


@pytest.mark.slow
def test_frozen_env_host_is_detected_and_rejoins(measured, tmp_path: Path) -> None:
    # loss_timeout (30 s) must outlast the freeze, or the thawed host's dead-man's switch
    # would rightly end it: the freeze here lasts 10 s.
    cfg = settings(tmp_path / "c", env_hosts=2, total_steps=100_000_000, keepalive_time=1,
                   keepalive_timeout=2, loss_timeout=30, stop_budget=30)
    log = tmp_path / "learner.log"
    cluster = start_hosts(cfg, learner_log=log)
    frozen_host = cluster.env_hosts[0]
    address = address_of(cluster, frozen_host)
    try:
        # Counts are relative (>=): a stream may connect more than once at start-up.
        wait_for(lambda: streaming(log, address) >= 2 and learner_step(cluster) > 0, 120,
                 "the learner to stream from both workers of the host")
        streams_before = streaming(log, address)
        lost_before = count(log, rf"lost worker {address}:")
        workers = worker_pids(cluster, frozen_host)
        group = [cluster.hosts[frozen_host].process.pid, *workers.values()]
        assert len(group) == 3
        for pid in group:  # the host process and its workers, as a frozen VM
            os.kill(pid, signal.SIGSTOP)
        frozen = time.monotonic()
        wait_for(lambda: count(log, rf"lost worker {address}:") >= lost_before + 2, 60,
                 "keepalive to detect both frozen workers")
        detect = time.monotonic() - frozen
        step_at_detect = learner_step(cluster)
        wait_for(lambda: learner_step(cluster) > step_at_detect + 2000, 60,
                 "training to continue on the other host")
        time.sleep(max(0.0, frozen + 10.0 - time.monotonic()))  # a 10 s freeze, deliberately
        for pid in group:
            os.kill(pid, signal.SIGCONT)
        thawed = time.monotonic()
        frozen_for = thawed - frozen
        wait_for(lambda: streaming(log, address) >= streams_before + 2, 60,
                 "both workers to rejoin")
        rejoin = time.monotonic() - thawed
        step_at_rejoin = learner_step(cluster)
        wait_for(lambda: learner_step(cluster) > step_at_rejoin + 2000, 60, "training on")
        cluster.hosts[cluster.learner].process.send_signal(signal.SIGTERM)
        wait_all_exit(cluster, cfg.stop_budget + 10)
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    result = collect_result(cluster)
    counters = {k: result.summary[k]
                for k in ("reconnects", "sequence_gaps", "fragments_duplicate")}
    measured(f"frozen env host {frozen_host} (host + 2 workers): detected {detect:.1f} s after "
          f"SIGSTOP (keepalive 1 s + 2 s), frozen {frozen_for:.1f} s (loss_timeout 30 s), "
          f"rejoined {rejoin:.1f} s after SIGCONT; counters {counters}")
    assert detect < 1 + 2 + 5  # keepalive time + timeout, with slack for a loaded machine
    assert set(result.exit_codes.values()) == {0}, (result.exit_codes, result.failures)
    assert result.summary["fragments_duplicate"] == 0
    assert result.summary["reconnects"] >= 2


@dataclasses.dataclass
class Namespaces:
    learner: str  # the learner host and the near env host, on this namespace's loopback
    env: str  # the far env host, behind a veth link
    link: str  # the far end of the veth pair, inside `env`
    env_address: str


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


@pytest.fixture
def namespaces():
    """Two fresh network namespaces joined by a veth pair (private 10.254.0.0/30 inside
    them); nothing is added to this machine's own namespace. Skipped where `ip netns`
    does not work (not root, no iproute2, a sandbox that forbids namespaces)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the ip netns variant needs root and iproute2")
    tag = str(os.getpid() % 100_000)
    ns = Namespaces(f"hetrl-l{tag}", f"hetrl-e{tag}", f"he{tag}", "10.254.0.2")
    created: list[str] = []
    try:
        for name in (ns.learner, ns.env):
            done = _ip("netns", "add", name)
            if done.returncode:
                pytest.skip(f"`ip netns add` does not work here: {done.stderr.strip()}")
            created.append(name)
        for step in (
            ("-n", ns.learner, "link", "add", f"hl{tag}", "type", "veth", "peer", "name",
             ns.link),
            ("-n", ns.learner, "link", "set", ns.link, "netns", ns.env),
            ("-n", ns.learner, "addr", "add", "10.254.0.1/30", "dev", f"hl{tag}"),
            ("-n", ns.env, "addr", "add", f"{ns.env_address}/30", "dev", ns.link),
            ("-n", ns.learner, "link", "set", "lo", "up"),
            ("-n", ns.env, "link", "set", "lo", "up"),
            ("-n", ns.learner, "link", "set", f"hl{tag}", "up"),
            ("-n", ns.env, "link", "set", ns.link, "up"),
        ):
            done = _ip(*step)
            if done.returncode:
                pytest.skip(f"`ip {' '.join(step)}` does not work here: {done.stderr.strip()}")
        yield ns
    finally:
        for name in created:
            _ip("netns", "del", name)


@pytest.mark.slow
def test_env_host_behind_a_downed_link_is_detected_and_rejoins(
    measured, tmp_path: Path, namespaces: Namespaces,
) -> None:
    ns = namespaces
    cfg = settings(tmp_path / "n", env_hosts=2, workers_per_env_host=1,
                   total_steps=100_000_000, keepalive_time=1, keepalive_timeout=2,
                   loss_timeout=30, stop_budget=30)
    log = tmp_path / "learner.log"
    cluster = prepare_hosts(cfg, learner_log=log)
    far = cluster.env_hosts[0]
    cluster.environment[HOST_MAP_ENV] += f",{far}={ns.env_address}"  # later entries win
    try:
        for host in [*cluster.env_hosts, cluster.learner]:
            start_host(cluster, host, ("ip", "netns", "exec", ns.env if host == far else
                                       ns.learner))
        wait_for(lambda: count(log, "streaming from worker") >= 2 and learner_step(cluster) > 0,
                 120, "training on both hosts")
        assert address_of(cluster, far) == ns.env_address
        far_before = streaming(log, ns.env_address)
        lost_before = count(log, rf"lost worker {ns.env_address}:")
        assert _ip("-n", ns.env, "link", "set", ns.link, "down").returncode == 0
        down = time.monotonic()
        wait_for(lambda: count(log, rf"lost worker {ns.env_address}:") >= lost_before + 1, 60,
                 "keepalive to detect the unreachable worker")
        detect = time.monotonic() - down
        step = learner_step(cluster)
        wait_for(lambda: learner_step(cluster) > step + 2000, 60, "training on the near host")
        time.sleep(max(0.0, down + 10.0 - time.monotonic()))  # a 10 s outage, deliberately
        assert _ip("-n", ns.env, "link", "set", ns.link, "up").returncode == 0
        up = time.monotonic()
        outage = up - down
        wait_for(lambda: streaming(log, ns.env_address) >= far_before + 1, 60,
                 "the far worker to rejoin")
        rejoin = time.monotonic() - up
        cluster.hosts[cluster.learner].process.send_signal(signal.SIGTERM)
        wait_all_exit(cluster, cfg.stop_budget + 10)
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    result = collect_result(cluster)
    measured(f"veth link to env host {far} down: detected {detect:.1f} s after (keepalive "
          f"1 s + 2 s), outage {outage:.1f} s (loss_timeout 30 s), rejoined {rejoin:.1f} s "
          f"after the link came up; duplicates {result.summary['fragments_duplicate']}")
    assert detect < 1 + 2 + 5
    assert set(result.exit_codes.values()) == {0}, (result.exit_codes, result.failures)
    assert result.summary["fragments_duplicate"] == 0


@pytest.mark.slow
def test_killed_learner_host_resumes_and_env_hosts_carry_on(measured, tmp_path: Path) -> None:
    # The restarted learner must arrive within the env hosts' loss_timeout (60 s).
    cfg = settings(tmp_path / "r", env_hosts=2, workers_per_env_host=1, total_steps=60_000,
                   checkpoint_every=1.0, loss_timeout=60, stop_budget=30)
    log = tmp_path / "learner.log"
    cluster = start_hosts(cfg, learner_log=log)
    ckpt_dir = cluster.root / "hosts" / cluster.learner / "checkpoints"
    try:
        wait_for(lambda: count(log, r"streaming from worker") >= 2, 120, "both streams")
        wait_for(lambda: checkpoints(ckpt_dir) and int(checkpoints(ckpt_dir)[0].stem[5:]) > 0,
                 120, "a periodic checkpoint")
        env_pids = {h: cluster.hosts[h].process.pid for h in cluster.env_hosts}
        workers_before = {h: worker_pids(cluster, h) for h in cluster.env_hosts}
        cluster.hosts[cluster.learner].process.send_signal(signal.SIGKILL)
        cluster.hosts[cluster.learner].process.wait(10)
        killed = time.monotonic()
        steps_before = steps_logged(cluster)
        newest = checkpoints(ckpt_dir)[0]
        saved = torch.load(newest, map_location="cpu", weights_only=True)
        streams_before = count(log, r"streaming from worker")
        start_host(cluster, cluster.learner)  # same command, tree, token and address
        wait_for(lambda: count(log, r"streaming from worker") >= streams_before + 2, 120,
                 "the new learner to stream from the running workers")
        rejoined = time.monotonic() - killed
        workers_after = {h: worker_pids(cluster, h) for h in cluster.env_hosts}
        wait_all_exit(cluster, 180)
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    result = collect_result(cluster)
    assert set(result.exit_codes.values()) == {0}, (result.exit_codes, result.failures)
    assert {h: c.process.pid for h, c in cluster.hosts.items() if h != cluster.learner} == env_pids
    assert workers_after == workers_before  # no env host restarted anything
    for host in cluster.env_hosts:
        # The env host's own restarts (its log also carries its workers' lines now).
        host_log = cluster.root / "hosts" / host / "host.log"
        assert count(host_log, r"exited with code -?\d+ \(.*\); restarting") == 0

    summary = result.summary
    assert summary["resumed_from"] == str(newest)
    resumed_steps = steps_logged(cluster)[len(steps_before):]
    final = torch.load(checkpoints(ckpt_dir)[0], map_location="cpu", weights_only=True)
    # Steps continue from the checkpoint, not from 0, and the run completes its budget.
    assert saved["global_step"] < resumed_steps[0] <= saved["global_step"] + 4 * 64 * 8
    assert summary["global_step"] >= cfg.total_steps
    # Optimizer state continues: Adam's step count is the checkpoint's plus 16 to 20 per
    # update since (4 epochs x 4 minibatches, a 5th when the valid steps do not divide
    # by 4); a fresh optimizer would count from 0.
    updates = final["policy_version"] - saved["policy_version"]
    adam_saved = int(saved["optimizer"]["state"][0]["step"])
    adam_final = int(final["optimizer"]["state"][0]["step"])
    assert updates > 0 and adam_saved > 0
    assert adam_saved + 16 * updates <= adam_final <= adam_saved + 20 * updates, (
        adam_saved, adam_final, updates)
    measured(f"learner host SIGKILLed at step {steps_before[-1]} (checkpoint step "
          f"{saved['global_step']}, policy version {saved['policy_version']}, Adam step "
          f"{adam_saved}); restarted, streaming from the same 2 workers {rejoined:.1f} s "
          f"after the kill; first step after resume {resumed_steps[0]}; finished at step "
          f"{summary['global_step']}, version {final['policy_version']}, Adam step "
          f"{adam_final} (= {adam_saved} + {updates} updates x 16..20); env host and worker PIDs "
          "unchanged; every host exited 0")


@pytest.mark.slow
@pytest.mark.parametrize("late", ["env_hosts", "learner"])
def test_late_start_either_way_waits_and_runs(measured, tmp_path: Path, late: str) -> None:
    # Same mechanism as 30 s (resolve_timeout / first_heartbeat_timeout retries), 8 s here.
    delay = 8.0
    cfg = settings(tmp_path / late, env_hosts=1, total_steps=6_000, stop_budget=30)
    log = tmp_path / "learner.log"
    cluster = prepare_hosts(cfg, learner_log=log)
    first, second = ([cluster.learner], cluster.env_hosts) if late == "env_hosts" else (
        cluster.env_hosts, [cluster.learner])
    try:
        for host in first:
            start_host(cluster, host)
        time.sleep(delay)  # deliberately late; nothing relies on it for correctness
        assert all(cluster.hosts[h].exit_code() is None for h in first), "gave up too early"
        started = time.monotonic()
        for host in second:
            start_host(cluster, host)
        wait_for(lambda: learner_step(cluster) > 0, 120, "training to start")
        to_train = time.monotonic() - started
        wait_all_exit(cluster, 180)
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    result = collect_result(cluster)
    measured(f"{late} started {delay:.0f} s late: first update {to_train:.1f} s after they "
          f"started; finished at step {result.summary.get('global_step')}; exit codes "
          f"{result.exit_codes}")
    assert set(result.exit_codes.values()) == {0}, (result.exit_codes, result.failures)
    assert result.summary["outcome"] == "finished"
    assert result.summary["global_step"] >= cfg.total_steps


@pytest.mark.slow
def test_sigterm_to_one_env_host_then_to_the_learner_host(measured, tmp_path: Path) -> None:
    cfg = settings(tmp_path / "t", env_hosts=2, workers_per_env_host=1,
                   total_steps=100_000_000, stop_budget=30)
    log = tmp_path / "learner.log"
    cluster = start_hosts(cfg, learner_log=log)
    ckpt_dir = cluster.root / "hosts" / cluster.learner / "checkpoints"
    stopped_host, other = cluster.env_hosts
    try:
        wait_for(lambda: count(log, "streaming from worker") >= 2 and learner_step(cluster) > 0,
                 120, "training on both hosts")
        workers = worker_pids(cluster, stopped_host)
        # (e) SIGTERM one env host: its workers stop, it exits 0, training goes on.
        term = time.monotonic()
        cluster.hosts[stopped_host].process.send_signal(signal.SIGTERM)
        wait_for(lambda: cluster.hosts[stopped_host].exit_code() is not None,
                 cfg.stop_budget, "the env host to exit")
        env_stop = time.monotonic() - term
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers.values())
        step = learner_step(cluster)
        wait_for(lambda: learner_step(cluster) > step + 2000, 60, "training on the other host")
        # (d) SIGTERM the learner host: checkpoint, stop the env hosts, all exit 0.
        before = set(checkpoints(ckpt_dir))
        term = time.monotonic()
        cluster.hosts[cluster.learner].process.send_signal(signal.SIGTERM)
        wait_all_exit(cluster, cfg.stop_budget)
        learner_stop = time.monotonic() - term
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    result = collect_result(cluster)
    assert set(result.exit_codes.values()) == {0}, (result.exit_codes, result.failures)
    written = set(checkpoints(ckpt_dir)) - before
    assert written and not list(ckpt_dir.glob(".*.tmp"))
    state = torch.load(max(written), map_location="cpu", weights_only=True)
    assert state["global_step"] == result.summary["global_step"]
    assert result.summary["outcome"] == "stopped: signal SIGTERM"
    assert "signal SIGTERM" in (cluster.root / "hosts" / stopped_host / "host.log").read_text()
    measured(f"SIGTERM env host {stopped_host}: it and its worker exited 0 after "
          f"{env_stop:.1f} s, training went on with {other}; SIGTERM learner host: "
          f"checkpoint at step {state['global_step']}, every host exited 0 after "
          f"{learner_stop:.1f} s (stop budget {cfg.stop_budget:.0f} s)")


@pytest.mark.slow
def test_env_host_health_follows_a_worker_restart(measured, tmp_path: Path) -> None:
    cfg = settings(tmp_path / "h", env_hosts=1, total_steps=100_000_000, stop_budget=30)
    cluster = start_hosts(cfg, learner_log=tmp_path / "learner.log")
    host = cluster.env_hosts[0]
    try:
        wait_for(lambda: learner_step(cluster) > 0, 120, "training to start")
        assert health(cluster, host, "hetrl.worker.0") == SERVING
        with pytest.raises(grpc.RpcError) as refused:  # health is behind the token too
            health(cluster, host, "hetrl.worker.0", token="wrong")
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        old = worker_pids(cluster, host)[0]
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: health(cluster, host, "hetrl.worker.0") == NOT_SERVING, 30,
                 "the killed worker to be NOT_SERVING", interval=0.02)
        down = time.monotonic() - killed
        wait_for(lambda: health(cluster, host, "") == NOT_SERVING, 5, "the host NOT_SERVING")
        assert health(cluster, host, "hetrl.worker.1") == SERVING
        wait_for(lambda: health(cluster, host, "hetrl.worker.0") == SERVING, 60,
                 "the restarted worker to be SERVING")
        up = time.monotonic() - killed
        wait_for(lambda: health(cluster, host, "") == SERVING, 5, "the host SERVING")
        assert worker_pids(cluster, host)[0] != old
        cluster.hosts[cluster.learner].process.send_signal(signal.SIGTERM)
        wait_all_exit(cluster, cfg.stop_budget + 10)
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    measured(f"worker 0 SIGKILLed: NOT_SERVING after {down:.2f} s, SERVING again after "
          f"{up:.1f} s (restart listening)")
    assert set(collect_result(cluster).exit_codes.values()) == {0}
