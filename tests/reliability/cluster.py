"""Helpers for fault-injection tests on an emulated cluster: the learner's progress and
log, the processes of one emulated host, and its health service. No waiting here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hetrl.launch.emulate import EmulatedCluster
from hetrl.rollout.transport import auth_metadata
from tests.helpers import processes_mentioning


def learner_step(cluster: EmulatedCluster) -> int:
    """The newest global step the learner host logged (0 before its first update)."""
    path = cluster.root / "hosts" / cluster.learner / "model" / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1])["global_step"] if lines else 0


def steps_logged(cluster: EmulatedCluster) -> list[int]:
    """Every global step in the learner host's metrics, in the order written."""
    path = cluster.root / "hosts" / cluster.learner / "model" / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["global_step"] for line in lines]


def count(path: Path, pattern: str) -> int:
    return len(re.findall(pattern, path.read_text())) if path.exists() else 0


def address_of(cluster: EmulatedCluster, host: str) -> str:
    """The emulated host's loopback address (127.0.0.N for algo-N)."""
    mapping = dict(item.split("=") for item in cluster.environment["HETRL_HOST_MAP"].split(","))
    return mapping[host]


def hyperparameter(cluster: EmulatedCluster, name: str):
    path = cluster.root / "hosts" / cluster.learner / "input" / "config" / "hyperparameters.json"
    return json.loads(json.loads(path.read_text())[name])


def worker_pids(cluster: EmulatedCluster, host: str) -> dict[int, int]:
    """PID of every running worker of an env host, by worker index (found via /proc:
    their command lines name the host's tree)."""
    run_dir = cluster.root / "hosts" / host / "hetrl"
    pids = {}
    for config in run_dir.glob("worker-*.json"):
        found = processes_mentioning(str(config))
        assert len(found) <= 1, (config, found)
        if found:
            pids[int(config.stem.split("-")[1])] = found[0]
    return pids


def health(cluster: EmulatedCluster, host: str, service: str, token: str = "") -> int:
    """An env host's grpc.health.v1 status of `service` (checks need the job's token)."""
    target = f"{address_of(cluster, host)}:{hyperparameter(cluster, 'control_port')}"
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2.0,
            metadata=auth_metadata(token or cluster.environment["HETRL_TOKEN"]))
    return reply.status


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
