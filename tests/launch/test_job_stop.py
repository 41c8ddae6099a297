"""A job stop as SageMaker delivers it: SIGTERM to PID 1 of every host's container.

Each emulated host runs in a new PID and mount namespace (`unshare --pid --fork
--mount-proc`, as root) with its tree mounted at /opt/ml, and PID 1 there runs exactly what
the job's container runs: the ContainerEntrypoint and ContainerArguments of the request
`hetrl submit` builds, on the `code` and `sm_drivers` channels the SDK would upload (its
own sm_train.sh, environment.py and install_requirements.py, pip kept offline). No network
is touched: hosts talk over loopback, and pip finds every requirement already installed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hetrl.launch.emulate import EmulateSettings, collect_result, prepare_hosts, start_host
from hetrl.launch.host import warn_unless_pid_1
from hetrl.launch.processes import stop_all
from hetrl.launch.submit import (
    COMMAND,
    SAGEMAKER_STOP_WINDOW,
    SubmitSettings,
    build_request,
)
from tests.helpers import wait_for
from tests.reliability.cluster import learner_step


def _namespaces_refused() -> str:
    """Why this machine cannot run a host as PID 1 of a new namespace ('' if it can)."""
    if shutil.which("unshare") is None:
        return "util-linux unshare is not installed"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return ("new PID and mount namespaces are not allowed here (needs root or "
                f"CAP_SYS_ADMIN): {probe.stderr.strip()}")
    return ""


def _container_command(request: dict, tree: Path) -> list[str]:
    """PID 1 of a new PID namespace that mounts `tree` at /opt/ml, then execs the
    request's ContainerEntrypoint + ContainerArguments, as the container runtime does."""
    spec = request["AlgorithmSpecification"]
    container = [*spec["ContainerEntrypoint"], *spec["ContainerArguments"]]
    setup = ("mount -t tmpfs hetrl-test /opt && mkdir /opt/ml && "
             f"mount --bind {shlex.quote(str(tree))} /opt/ml && exec \"$@\"")
    return ["unshare", "--pid", "--fork", "--mount-proc", "--propagation", "private",
            "/bin/sh", "-c", setup, "sh", *container]


def test_the_job_command_execs_the_launcher(tmp_path: Path, aws_offline) -> None:
    pytest.importorskip("sagemaker.train")
    request = build_request(_submit_settings(), channels_into=tmp_path)
    script = (tmp_path / "sm_drivers" / "sm_train.sh").read_text()
    assert f'{COMMAND}\nSAGEMAKER_BASE_COMMAND_EOF' in script
    assert 'eval "$CMD"' in script  # the SDK's template, which forks unless told to exec
    assert request["AlgorithmSpecification"]["ContainerEntrypoint"] == ["/bin/bash"]
    launcher = (tmp_path / "code" / "launcher.py").read_text()
    assert launcher.index("catch_stop_early()") < launcher.index("hetrl.launch.host")


def test_a_host_not_pid_1_under_sagemaker_warns(monkeypatch, caplog) -> None:
    monkeypatch.delenv("TRAINING_JOB_NAME", raising=False)
    assert not warn_unless_pid_1(pid=42)  # not under SageMaker (local, emulate): quiet
    monkeypatch.setenv("TRAINING_JOB_NAME", "job")
    assert not warn_unless_pid_1(pid=1)
    assert warn_unless_pid_1(pid=42)
    assert "may never reach it" in caplog.text


def _submit_settings(**overrides) -> SubmitSettings:
    return SubmitSettings(role="arn:aws:iam::123456789012:role/R", region="us-east-1",
                          output="s3://bucket/runs", **overrides)


@pytest.mark.slow
def test_sigterm_to_pid_1_of_every_host_checkpoints_and_every_host_exits_0(
        measured, tmp_path: Path, aws_offline) -> None:
    pytest.importorskip("sagemaker.train")
    refused = _namespaces_refused()
    if refused:
        pytest.skip(refused)
    settings = EmulateSettings(env_hosts=2, workers_per_env_host=1, total_steps=100_000_000,
                               checkpoint_dir="/opt/ml/checkpoints", out=str(tmp_path / "job"),
                               progress=False)
    channels = tmp_path / "channels"
    request = build_request(_submit_settings(), channels_into=channels)
    cluster = prepare_hosts(settings, learner_log=tmp_path / "job" / "learner.log")
    venv_bin = str(Path(sys.executable).parent)
    environment = {
        "TRAINING_JOB_NAME": "hetrl-pid-1-test", "SAGEMAKER_BASE_DIR": "/opt/ml",
        "PYTHONPATH": "",  # a real host has none: hetrl comes from the code channel
        "PATH": f"{venv_bin}:{os.environ['PATH']}",  # sm_train.sh runs `python3`
        "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",  # offline: all installed
    }
    for host in [*cluster.env_hosts, cluster.learner]:
        tree = cluster.root / "hosts" / host
        for channel in ("code", "sm_drivers"):
            shutil.copytree(channels / channel, tree / "input" / "data" / channel)
        start_host(cluster, host, command=tuple(_container_command(request, tree)),
                   environment=environment)
    try:
        wait_for(lambda: learner_step(cluster) > 4096, 240, "the learner to train")
        pid_1 = {}
        for host, child in cluster.hosts.items():
            inits = psutil.Process(child.process.pid).children()
            assert len(inits) == 1, (host, inits)
            pid_1[host] = inits[0]
            # exec all the way: PID 1 is the launcher itself, not bash running sm_train.sh
            assert pid_1[host].cmdline()[-1:] == ["launcher.py"], pid_1[host].cmdline()
        signalled = time.time()
        start = time.monotonic()
        for process in pid_1.values():  # what StopTrainingJob or a spot interruption does
            process.send_signal(signal.SIGTERM)
        wait_for(lambda: all(c.exit_code() is not None for c in cluster.hosts.values()),
                 SAGEMAKER_STOP_WINDOW, "every host to exit inside SageMaker's window")
        elapsed = time.monotonic() - start
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    result = collect_result(cluster)
    logs = {h: (cluster.root / "hosts" / h / "host.log") for h in cluster.env_hosts}
    logs[cluster.learner] = tmp_path / "job" / "learner.log"
    assert set(result.exit_codes.values()) == {0}, (
        result.exit_codes, result.failures,
        {h: p.read_text()[-3000:] for h, p in logs.items() if p.exists()})
    learner_tree = cluster.root / "hosts" / cluster.learner
    checkpoints = list((learner_tree / "checkpoints").glob("ckpt-*"))
    assert checkpoints and max(p.stat().st_mtime for p in checkpoints) >= signalled
    # the final model also sits beside the checkpoints, which SageMaker syncs with S3
    assert (learner_tree / "checkpoints" / "final" / "model.safetensors").stat().st_mtime \
        >= signalled
    summary = json.loads((learner_tree / "model" / "summary.json").read_text())
    assert summary["outcome"] == "stopped: signal SIGTERM"
    for host in cluster.env_hosts:
        text = logs[host].read_text()
        assert "env host" in text and "stopped" in text, text[-2000:]
        assert "not PID 1" not in text
        # the container's stdout (CloudWatch) has every process's lines, prefixed
        assert f"[{host} env-host] " in text and f"[{host} worker-0] " in text
        kept = cluster.root / "hosts" / host / "output" / "data" / host
        assert {p.name for p in kept.glob("*.log")} == {"env-host.log", "worker-0.log"}
        assert "stop" in (kept / "worker-0.log").read_text()
    assert f"[{cluster.learner} learner] " in logs[cluster.learner].read_text()
    kept = learner_tree / "output" / "data" / cluster.learner
    assert "checkpoint" in (kept / "learner.log").read_text()
    assert elapsed < SAGEMAKER_STOP_WINDOW / 2, elapsed
    measured(f"SIGTERM to PID 1 of {len(pid_1)} hosts: final checkpoint at step "
          f"{summary['global_step']}, every host exited 0 after {elapsed:.1f} s")
