"""Reading the job (resource config, hyperparameters) and the host entry point's branching,
on SageMaker-shaped trees written by the test."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from hetrl.launch.cluster import parse_host_map, resolve
from hetrl.launch.env_host import HostControl
from hetrl.launch.learner_host import HostRanks, host_ranks
from hetrl.launch.settings import ClusterSettings
from hetrl.protos import hetrl_pb2, hetrl_pb2_grpc
from hetrl.rollout.errors import ConfigError
from hetrl.rollout.transport import auth_metadata, create_channel, create_server
from tests.helpers import ROOT

DESIGN_EXAMPLE = {
    "current_group_name": "env_group", "current_host": "algo-1",
    "current_instance_type": "ml.c5.9xlarge", "hosts": ["algo-1", "algo-2", "algo-3"],
    "instance_groups": [
        {"instance_group_name": "env_group", "instance_type": "ml.c5.9xlarge",
         "hosts": ["algo-3", "algo-1"]},
        {"instance_group_name": "learner_group", "instance_type": "ml.g5.2xlarge",
         "hosts": ["algo-2"]}],
    "network_interface_name": "eth0",
}


def write_tree(base: Path, resource: dict, hyperparameters: dict) -> Path:
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config / "inputdataconfig.json").write_text("{}")
    return base


# AWS's example of a heterogeneous job's resourceconfig.json (SageMaker developer guide,
# "How Amazon SageMaker Provides Training Information": distributed training configuration
# of a heterogeneous cluster), in its shape: group host lists unsorted, the job's host list
# unsorted too, and group membership unrelated to algo numbers.
AWS_EXAMPLE = {
    "current_host": "algo-4", "current_instance_type": "ml.c5.18xlarge",
    "current_group_name": "data_group",
    "hosts": ["algo-4", "algo-2", "algo-1", "algo-3"],
    "instance_groups": [
        {"instance_group_name": "data_group", "instance_type": "ml.c5.18xlarge",
         "hosts": ["algo-4", "algo-1"]},
        {"instance_group_name": "dnn_group", "instance_type": "ml.p4d.24xlarge",
         "hosts": ["algo-3", "algo-2"]}],
    "network_interface_name": "eth0",
}
# A homogeneous job: no instance groups at all.
HOMOGENEOUS = {"current_host": "algo-2", "hosts": ["algo-2", "algo-1"],
               "network_interface_name": "eth0"}
HYPERPARAMETERS = {"total_steps": "1000", "env": '"Pendulum-v1"', "hidden_sizes": "[32, 32]",
                   "anneal_lr": "false", "env_groups": "cpu_a,cpu_b",
                   "sagemaker_program": '"launcher.py"', "plain": "not json"}
# Makes `import sagemaker_training` fail, as on an image without the toolkit.
WITHOUT_TOOLKIT = "import sys; sys.modules['sagemaker_training'] = None; "


def run_host(base: Path, *args: str, timeout: float = 60,
             toolkit: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, SAGEMAKER_BASE_DIR=str(base), HETRL_TOKEN="t",
               HETRL_HOST_MAP="algo-1=127.0.0.1,algo-2=127.0.0.2,algo-3=127.0.0.3")
    code = ("" if toolkit else WITHOUT_TOOLKIT) + (
        "import runpy, sys; sys.argv[1:] = sys.argv[2:]; "
        "runpy.run_module('hetrl.launch.host', run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, "--", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def read_cluster_in(base: Path, toolkit: bool = True) -> dict:
    """read_cluster in a child (sagemaker_training reads its base dir at import), with
    the toolkit or as on an image that lacks it."""
    code = ("" if toolkit else WITHOUT_TOOLKIT) + (
        "import json, sys; from hetrl.launch.cluster import read_cluster; c = read_cluster(); "
        "print(json.dumps({'host': c.current_host, 'group': c.current_group, "
        "'groups': c.groups, 'types': c.instance_types, 'hetero': c.is_hetero, "
        "'hp': c.hyperparameters, 'env_hosts': c.hosts_of(('env_group',)), "
        "'model': str(c.model_dir), 'output': str(c.output_dir), 'base': str(c.base_dir), "
        "'cpus': c.num_cpus, 'gpus': c.num_gpus, 'interface': c.network_interface, "
        "'toolkit': 'sagemaker_training.environment' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env=dict(os.environ, SAGEMAKER_BASE_DIR=str(base)),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("toolkit", [True, False], ids=["toolkit", "files"])
def test_reads_the_design_example_without_sorting(tmp_path: Path, toolkit: bool) -> None:
    base = write_tree(tmp_path, DESIGN_EXAMPLE, {"total_steps": "1000", "env": '"Pendulum-v1"'})
    view = read_cluster_in(base, toolkit)
    assert view["toolkit"] is toolkit
    assert view["host"] == "algo-1" and view["group"] == "env_group" and view["hetero"]
    assert view["env_hosts"] == ["algo-3", "algo-1"]  # as configured, not sorted
    assert view["groups"]["learner_group"] == ["algo-2"]
    assert view["hp"] == {"total_steps": 1000, "env": "Pendulum-v1"}
    assert view["model"] == str(base / "model")


@pytest.mark.parametrize("resource", [DESIGN_EXAMPLE, AWS_EXAMPLE, HOMOGENEOUS],
                         ids=["design", "aws", "homogeneous"])
def test_the_files_read_exactly_as_the_toolkit_reads_them(tmp_path: Path,
                                                          resource: dict) -> None:
    base = write_tree(tmp_path, resource, HYPERPARAMETERS)
    with_toolkit, without = read_cluster_in(base, True), read_cluster_in(base, False)
    assert with_toolkit.pop("toolkit") and not without.pop("toolkit")
    assert without == with_toolkit
    if resource is AWS_EXAMPLE:
        assert without["groups"] == {"data_group": ["algo-4", "algo-1"],
                                     "dnn_group": ["algo-3", "algo-2"]}
        assert without["group"] == "data_group" and without["hetero"]
        assert without["types"]["dnn_group"] == "ml.p4d.24xlarge"
    if resource is HOMOGENEOUS:
        assert without["groups"] == {"homogeneousCluster": ["algo-2", "algo-1"]}
        assert not without["hetero"]
    assert without["hp"]["plain"] == "not json" and "sagemaker_program" not in without["hp"]


def test_without_the_toolkit_a_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    result = run_host(tmp_path, toolkit=False)
    assert result.returncode == 2
    assert "cannot read the SageMaker config under" in result.stderr


def test_host_map_and_resolve() -> None:
    assert parse_host_map("algo-1=127.0.0.1, algo-2=127.0.0.2") == {
        "algo-1": "127.0.0.1", "algo-2": "127.0.0.2"}
    with pytest.raises(ConfigError, match="name=address"):
        parse_host_map("algo-1")
    assert resolve("localhost", 1.0) == "127.0.0.1"


@pytest.mark.parametrize("toolkit", [True, False], ids=["toolkit", "files"])
def test_unknown_group_writes_the_failure_file(tmp_path: Path, toolkit: bool) -> None:
    resource = dict(DESIGN_EXAMPLE, current_group_name="mystery_group")
    resource["instance_groups"] = [*DESIGN_EXAMPLE["instance_groups"],
                                   {"instance_group_name": "mystery_group", "hosts": ["algo-1"]}]
    base = write_tree(tmp_path, resource, {})
    result = run_host(base, toolkit=toolkit)
    assert result.returncode == 2, result.stderr
    failure = (base / "output" / "failure").read_text()
    assert "mystery_group" in failure and "learner_group" in failure


def test_unknown_hyperparameter_fails_the_host_clearly(tmp_path: Path) -> None:
    base = write_tree(tmp_path, DESIGN_EXAMPLE, {"totl_steps": "5"})
    result = run_host(base)
    assert result.returncode == 2
    assert "unknown hyperparameter 'totl_steps'" in (base / "output" / "failure").read_text()


@pytest.mark.parametrize("gpus, per_host", [(8, 0), (0, 0), (8, 2)])
def test_every_learner_host_agrees_on_its_ranks_and_where_they_meet(
        monkeypatch, tmp_path: Path, gpus: int, per_host: int) -> None:
    # AWS's example: the GPU group lists its hosts unsorted (algo-3, algo-2); whichever
    # host reads it, rank 0 is on algo-2 (natural order) and the group meets there.
    monkeypatch.setenv("HETRL_HOST_MAP", "algo-2=10.0.0.2,algo-3=10.0.0.3")
    settings = ClusterSettings(env_groups=("data_group",), learner_group="dnn_group",
                               learners_per_host=per_host, group_port=7010)
    places = {}
    for host in ("algo-3", "algo-2"):
        view = dataclasses.replace(read_view(AWS_EXAMPLE, tmp_path / host),
                                   current_host=host, num_gpus=gpus)
        places[host] = host_ranks(settings, view)
    each = per_host or max(1, gpus)
    assert places["algo-2"] == HostRanks(0, each, 2 * each, "10.0.0.2:7010")
    assert places["algo-3"] == HostRanks(each, each, 2 * each, "10.0.0.2:7010")
    assert places["algo-2"].leader and not places["algo-3"].leader


def test_a_host_outside_the_learner_group_has_no_rank(tmp_path: Path) -> None:
    view = read_view(AWS_EXAMPLE, tmp_path)  # algo-4 is a data_group host
    settings = ClusterSettings(env_groups=("data_group",), learner_group="dnn_group")
    with pytest.raises(ConfigError, match="not this host 'algo-4'"):
        host_ranks(settings, view)


def read_view(resource: dict, base: Path):
    from hetrl.launch.cluster import read_cluster_files

    return read_cluster_files(write_tree(base, resource, {}))


def test_env_host_without_learner_fails_after_first_heartbeat_timeout(tmp_path: Path) -> None:
    base = write_tree(tmp_path, DESIGN_EXAMPLE, {
        "first_heartbeat_timeout": "3", "workers_per_env_host": "1", "control_port": "47311",
        "worker_base_port": "47312"})
    result = run_host(base, timeout=60)
    assert result.returncode == 1, result.stderr
    failure = (base / "output" / "failure").read_text()
    assert "no learner connected within 3 s" in failure


def test_stop_needs_the_token() -> None:
    control = HostControl("algo-1", ["127.0.0.1:1"], 2)
    server, port = create_server("127.0.0.1:0", "secret")
    hetrl_pb2_grpc.add_HostControlServicer_to_server(control, server)
    server.start()
    try:
        stub = hetrl_pb2_grpc.HostControlStub(create_channel(f"127.0.0.1:{port}"))
        for metadata in ((), auth_metadata("wrong")):
            with pytest.raises(grpc.RpcError) as info:
                stub.Stop(hetrl_pb2.StopRequest(reason="x"), metadata=metadata, timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert control.stop_reason is None
        reply = stub.Stop(hetrl_pb2.StopRequest(reason="done"),
                          metadata=auth_metadata("secret"), timeout=5)
        assert reply.accepted and control.stop_reason == "done"
    finally:
        server.stop(0)
