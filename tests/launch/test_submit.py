"""Job submission, offline: the request the sagemaker SDK builds, checked against botocore.

Nothing here may reach the network: fake credentials, no instance metadata, the SDK's
telemetry opted out through its config file (v3 has no environment variable for it), and
every name lookup or socket connect fails the test. Each request is validated with botocore's
ParamValidator and sent to a real client under a Stubber, never to AWS.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sagemaker.train.model_trainer", reason="needs hetrl[sagemaker]")

import boto3  # noqa: E402
import botocore.session  # noqa: E402
import tyro  # noqa: E402
from botocore.stub import Stubber  # noqa: E402
from botocore.validate import ParamValidator  # noqa: E402

from hetrl.launch.hyperparameters import to_hyperparameters  # noqa: E402
from hetrl.launch.settings import ClusterSettings  # noqa: E402
from hetrl.launch.submit import (  # noqa: E402
    LAUNCHER,
    MASK,
    SubmitSettings,
    build_request,
    build_trainer,
    run_submit,
    stage_code,
)
from hetrl.rollout.errors import ConfigError  # noqa: E402
from hetrl.rollout.settings import pick  # noqa: E402

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8-gpu-py312"
EXAMPLE = dict(env="Humanoid-v5", env_type="ml.c5.9xlarge", env_count=2,
               learner_type="ml.g5.2xlarge", role=ROLE, region="us-east-1", image=IMAGE,
               output="s3://bucket/prefix", spot=True, dry_run=True)


@pytest.fixture(autouse=True)
def offline(aws_offline):
    """Every test here runs offline (see conftest.aws_offline)."""


def example(**changes) -> SubmitSettings:
    return SubmitSettings(**{**EXAMPLE, **changes})


def assert_valid_for_botocore(request: dict) -> None:
    """The request fits CreateTrainingJob's input shape, and a stubbed client takes it."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.operation_model("CreateTrainingJob").input_shape
    report = ParamValidator().validate(request, shape)
    assert not report.has_errors(), report.generate_report()
    client = boto3.client("sagemaker", region_name="us-east-1")
    with Stubber(client) as stub:
        arn = "arn:aws:sagemaker:us-east-1:123456789012:training-job/x"
        stub.add_response("create_training_job", {"TrainingJobArn": arn},
                          expected_params=request)
        assert client.create_training_job(**request)["TrainingJobArn"] == arn
        stub.assert_no_pending_responses()


def test_example_request_is_a_valid_heterogeneous_spot_job():
    request = build_request(example())
    assert_valid_for_botocore(request)

    resources = request["ResourceConfig"]
    assert "InstanceType" not in resources and "InstanceCount" not in resources
    assert resources["InstanceGroups"] == [
        {"InstanceGroupName": "env_group", "InstanceType": "ml.c5.9xlarge", "InstanceCount": 2},
        {"InstanceGroupName": "learner_group", "InstanceType": "ml.g5.2xlarge",
         "InstanceCount": 1},
    ]
    groups = {g["InstanceGroupName"] for g in resources["InstanceGroups"]}
    channels = request["InputDataConfig"]
    assert {c["ChannelName"] for c in channels} == {"code", "sm_drivers"}
    assigned = [c["DataSource"]["S3DataSource"].get("InstanceGroupNames") for c in channels]
    # All-or-nothing: no channel names groups (each reaches every host), or every one does
    # and then each reaches both groups, since every host needs the code.
    assert all(a is None for a in assigned) or all(set(a) == groups for a in assigned)
    for channel in channels:
        assert channel["DataSource"]["S3DataSource"]["S3Uri"].startswith("s3://bucket/prefix/")

    assert request["HyperParameters"] == {"env": '"Humanoid-v5"'}
    assert set(request["Environment"]) == {"HETRL_TOKEN"}
    assert len(request["Environment"]["HETRL_TOKEN"]) >= 43
    assert request["EnableManagedSpotTraining"] is True
    stopping = request["StoppingCondition"]
    assert stopping["MaxWaitTimeInSeconds"] > stopping["MaxRuntimeInSeconds"] == 86_400
    checkpoints = request["CheckpointConfig"]
    assert checkpoints["LocalPath"] == "/opt/ml/checkpoints"
    assert checkpoints["S3Uri"].startswith("s3://bucket/prefix/hetrl-Humanoid-v5/")
    assert checkpoints["S3Uri"].endswith("/checkpoints")
    assert request["OutputDataConfig"]["S3OutputPath"] == "s3://bucket/prefix"
    assert request["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert request["RoleArn"] == ROLE
    assert request["TrainingJobName"].startswith("hetrl-Humanoid-v5-")


def test_real_submission_builds_the_same_trainer_with_a_fresh_token(monkeypatch, tmp_path):
    """Without --dry-run: construction only (train() would create the job)."""
    from sagemaker.core.helper.session_helper import Session

    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")  # the SDK's IAM check needs AWS
    session = Session(boto_session=boto3.Session(region_name="us-east-1"),
                      default_bucket="bucket", default_bucket_prefix="prefix")
    settings = example(dry_run=False)
    stage_code(settings, tmp_path)
    first, second = (build_trainer(settings, tmp_path, session) for _ in range(2))
    assert [(g.instance_group_name, g.instance_type, g.instance_count)
            for g in first.compute.instance_groups] == [
        ("env_group", "ml.c5.9xlarge", 2), ("learner_group", "ml.g5.2xlarge", 1)]
    assert first.compute.enable_managed_spot_training is True
    assert first.stopping_condition.max_wait_time_in_seconds == 2 * 86_400
    # Run as a command, so the SDK does not also pass hyperparameters as flags.
    # exec: the launcher becomes PID 1 of the container, so a job stop's SIGTERM reaches it
    assert first.source_code.command == "exec python3 launcher.py"
    assert first.source_code.entry_script is None and not first.source_code.args
    assert first.hyperparameters == {"env": '"Humanoid-v5"'}
    assert first.environment["HETRL_TOKEN"] != second.environment["HETRL_TOKEN"]


def test_settings_choices_reach_the_request(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("gymnasium[mujoco]>=1.0,<2\n")
    request = build_request(example(
        spot=False, image="", max_run=7200, checkpoint_s3="s3://ckpt/run-1",
        checkpoint_dir="/opt/ml/checkpoints/hetrl", job_name="humanoid-a", volume_size_gb=100,
        env_groups=("sim",), learner_group="gpu", source_dir=str(code),
        requirements="requirements.txt", learning_rate=3e-4, hidden_sizes=(256, 256)))
    assert_valid_for_botocore(request)
    assert request.get("EnableManagedSpotTraining") in (None, False)
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200}
    assert request["CheckpointConfig"] == {"S3Uri": "s3://ckpt/run-1",
                                           "LocalPath": "/opt/ml/checkpoints/hetrl"}
    assert request["TrainingJobName"].startswith("humanoid-a-")
    assert request["ResourceConfig"]["VolumeSizeInGB"] == 100
    assert [g["InstanceGroupName"] for g in request["ResourceConfig"]["InstanceGroups"]] == [
        "sim", "gpu"]
    # Resolved offline by the SDK for the region, the default version and the learner's GPU.
    assert request["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert json.loads(request["HyperParameters"]["env_groups"]) == ["sim"]
    assert json.loads(request["HyperParameters"]["hidden_sizes"]) == [256, 256]


def test_a_learner_group_of_two_instances_is_a_valid_request():
    request = build_request(example(learner_count=2, learners_per_host=1, group_port=7020))
    assert_valid_for_botocore(request)
    groups = {g["InstanceGroupName"]: g["InstanceCount"]
              for g in request["ResourceConfig"]["InstanceGroups"]}
    assert groups == {"env_group": 2, "learner_group": 2}
    # Every learner host finds its ranks and the rendezvous (rank 0's host, the group
    # port) from the job's config and these hyperparameters (test_cluster shows how).
    hyperparameters = request["HyperParameters"]
    assert json.loads(hyperparameters["learners_per_host"]) == 1
    assert json.loads(hyperparameters["group_port"]) == 7020
    assert "learner_count" not in hyperparameters  # the hosts read it from the config


def test_hyperparameters_are_the_changed_training_flags_and_parse_back():
    settings = example(hidden_sizes=(256, 256), env_import=("my_envs",), learning_rate=3e-4,
                       anneal_lr=False, workers_per_env_host=30, max_run=3600)
    values = to_hyperparameters(settings)
    assert set(values) == {"env", "hidden_sizes", "env_import", "learning_rate", "anneal_lr",
                           "workers_per_env_host"}
    assert values["hidden_sizes"] == "[256, 256]" and values["anneal_lr"] == "false"
    parsed = ClusterSettings(**{key: json.loads(value) for key, value in values.items()})
    assert dataclasses.asdict(parsed) == dataclasses.asdict(pick(ClusterSettings, settings))


def test_staged_code_has_hetrl_the_user_code_requirements_and_entry(tmp_path):
    user = tmp_path / "user"
    (user / "my_envs" / "__pycache__").mkdir(parents=True)
    (user / "my_envs" / "__init__.py").write_text("")
    (user / "my_envs" / "__pycache__" / "x.pyc").write_bytes(b"")
    (user / "reqs.txt").write_text("gymnasium[mujoco]>=1.0,<2\n")
    staged = tmp_path / "staged"
    staged.mkdir()
    stage_code(example(source_dir=str(user), requirements="reqs.txt"), staged)

    for package in ("protos", "rollout", "learner", "launch"):
        assert (staged / "hetrl" / package / "__init__.py").is_file()
    assert (staged / "hetrl" / "__init__.py").is_file()
    assert (staged / "hetrl" / "protos" / "hetrl.proto").is_file()
    assert not (staged / "hetrl" / "tests").exists() and not (staged / "hetrl" / "bench").exists()
    assert not list(staged.rglob("__pycache__"))
    assert (staged / "launcher.py").read_text() == LAUNCHER
    assert "raise SystemExit(main())" in LAUNCHER
    assert (staged / "my_envs" / "__init__.py").is_file()
    lines = (staged / "requirements.txt").read_text().splitlines()
    names = [line.split("<")[0].split(">")[0].split("=")[0] for line in lines]
    assert "torch" not in names
    assert {"gymnasium", "grpcio", "protobuf", "numpy", "tyro"} <= set(names)
    assert lines[-1] == "gymnasium[mujoco]>=1.0,<2"


@pytest.mark.parametrize("name", ["hetrl", "launcher.py", "requirements.txt"])
def test_user_code_may_not_shadow_hetrl(tmp_path, name):
    user = tmp_path / "user"
    user.mkdir()
    (user / name).mkdir()
    with pytest.raises(ConfigError, match=f"--source-dir .* has {name}"):
        stage_code(example(source_dir=str(user)), tmp_path)


@pytest.mark.parametrize("changes, flag", [
    (dict(role=""), "--role"),
    (dict(role="SageMakerRole"), "--role"),
    (dict(region=""), "--region"),
    (dict(output="bucket/prefix"), "--output"),
    (dict(checkpoint_s3="/tmp/ckpt"), "--checkpoint-s3"),
    (dict(env_type="c5.9xlarge"), "--env-type"),
    (dict(env_count=0), "--env-count"),
    (dict(env_groups=("a", "b")), "--env-groups"),
    (dict(max_wait=100, max_run=100), "--max-wait"),
    (dict(spot=False, max_wait=100), "--max-wait"),
    (dict(job_name="my_job"), "--job-name"),
    (dict(requirements="requirements.txt"), "--requirements"),
    (dict(source_dir="/nonexistent/hetrl"), "--source-dir"),
    (dict(learning_rate=0.0), "--learning-rate"),
    (dict(stop_budget=120.0), "--stop-budget"),
    (dict(wait=True), "--wait"),
    (dict(no_requirements=True, requirements="r.txt"), "--no-requirements"),
])
def test_bad_settings_name_the_flag(changes, flag):
    with pytest.raises(ConfigError, match=flag):
        example(**changes)


def test_unknown_image_version_says_what_to_do():
    with pytest.raises(ConfigError, match="--image"):
        build_request(example(image="", pytorch_version="0.1"))


def test_run_submit_dry_run_prints_the_request(capsys):
    assert run_submit(example()) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["Environment"] == {"HETRL_TOKEN": MASK}
    assert printed["ResourceConfig"]["InstanceGroups"][0]["InstanceCount"] == 2
    assert_valid_for_botocore(printed)


def test_cli_flags_of_the_issue_example():
    args = ("submit --env Humanoid-v5 --env-type ml.c5.9xlarge --env-count 2 "
            f"--learner-type ml.g5.2xlarge --role {ROLE} --region us-east-1 --image {IMAGE} "
            "--output s3://bucket/prefix --spot --dry-run").split()
    settings = tyro.extras.subcommand_cli_from_dict({"submit": SubmitSettings}, args=args)
    assert settings == example()


def test_missing_sdk_tells_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sagemaker.train.model_trainer", None)
    with pytest.raises(ConfigError, match=r"pip install 'hetrl\[sagemaker\]'"):
        build_request(example())


def test_importing_submit_does_not_import_the_sdk():
    code = ("import sys, launch.submit; "
            "sys.exit(any(m.split('.')[0] in ('sagemaker', 'boto3') for m in sys.modules))")
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)


def test_dry_run_masks_the_token_and_keeps_the_sdk_quiet():
    """issue 11 item 6: no secret in clear, no SDK log noise (e.g. its "No region
    provided" although --region was given) in the user's terminal."""
    from tests.helpers import ROOT

    proc = subprocess.run(
        [sys.executable, "-m", "hetrl.launch", "submit", "--env", "CartPole-v1", "--role",
         ROLE, "--region", "eu-west-1", "--image", IMAGE, "--output", "s3://bucket/prefix",
         "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err
    assert json.loads(out)["Environment"] == {"HETRL_TOKEN": MASK}
    assert err == "", err


def test_verbose_sdk_lines_pass_with_secrets_masked():
    import io
    import logging

    from hetrl.launch.submit import _sdk_logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.root.addHandler(handler)
    sdk, ours = logging.getLogger("sagemaker.core.test"), logging.getLogger("hetrl.test")
    try:
        for verbose in (False, True):
            with _sdk_logging(verbose, ["s3cr3t-t0ken"]):
                sdk.warning("No region provided; env HETRL_TOKEN=%s", "s3cr3t-t0ken")
                ours.warning("hetrl line s3cr3t-t0ken")
    finally:
        logging.root.removeHandler(handler)
    assert stream.getvalue().splitlines() == [
        "hetrl line ******",  # quiet: only hetrl's own line, masked
        "No region provided; env HETRL_TOKEN=******", "hetrl line ******"]  # verbose
    sdk.warning("after")  # levels are restored afterwards


@pytest.mark.parametrize("changes, match", [
    (dict(env_type="ml.c5.9xlarg"), r"--env-type ml.c5.9xlarg is not a SageMaker training "
                                    r"instance type; did you mean ml.c5.9xlarge"),
    (dict(learner_type="ml.g5.3xlarge"), "--learner-type ml.g5.3xlarge is not"),
    (dict(env="My'Env-v0"), r"--env .* contains a ' \(single quote\)"),
    (dict(image="", volume_size_gb=10), "--volume-size-gb 10 is too small"),
])
def test_what_would_fail_on_the_hosts_is_refused_at_submit(changes, match):
    with pytest.raises(ConfigError, match=match):
        build_request(example(**changes))


def test_mujoco_without_a_requirement_warns_and_no_requirements_installs_nothing(tmp_path):
    from hetrl.launch.submit import check_on_aws_terms

    (warning,) = check_on_aws_terms(example(env="Humanoid-v5"))
    assert "needs MuJoCo" in warning and "gymnasium[mujoco]" in warning
    assert "needs Atari" in check_on_aws_terms(example(env="ALE/Pong-v5"))[0]
    (tmp_path / "reqs.txt").write_text("gymnasium[mujoco]>=1.0,<2\n")
    assert check_on_aws_terms(example(env="Humanoid-v5", source_dir=str(tmp_path),
                                      requirements="reqs.txt")) == []
    assert check_on_aws_terms(example(env="CartPole-v1")) == []
    # An image that has everything: no requirements.txt, no install step in sm_train.sh
    request = build_request(example(env="Humanoid-v5", no_requirements=True),
                            channels_into=tmp_path / "channels")
    assert not (tmp_path / "channels" / "code" / "requirements.txt").exists()
    script = (tmp_path / "channels" / "sm_drivers" / "sm_train.sh").read_text()
    assert "install_requirements" not in script and "exec python3 launcher.py" in script
    assert_valid_for_botocore(request)
