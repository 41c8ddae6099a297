"""Following a job (`submit --wait`) and fetching it (`hetrl fetch`), against botocore's
Stubber: every call and reply is checked against the service models; nothing is sent."""

from __future__ import annotations

import datetime
import io
import json
import tarfile
from pathlib import Path

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from hetrl.launch.jobs import LOG_GROUP, FetchSettings, fetch, follow
from hetrl.rollout.errors import ConfigError

JOB = "hetrl-CartPole-v1-20261201000000"
OUT = f"s3://bucket/runs/{JOB}/output"


@pytest.fixture(autouse=True)
def offline(aws_offline):
    """Fake credentials, no metadata, no network (see conftest.aws_offline)."""


def described(status: str, **extra) -> dict:
    """A DescribeTrainingJob reply with the members its model requires."""
    return {"TrainingJobName": JOB,
            "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{JOB}",
            "ModelArtifacts": {"S3ModelArtifacts": f"{OUT}/model.tar.gz"},
            "TrainingJobStatus": status, "SecondaryStatus": "Training",
            "StoppingCondition": {"MaxRuntimeInSeconds": 86_400},
            "CreationTime": datetime.datetime(2026, 12, 1), **extra}


def events(stream: str, messages: list[str], token: str, after: str | None = None):
    params = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": True}
    if after:
        params["nextToken"] = after
    reply = {"events": [{"timestamp": 0, "message": m, "ingestionTime": 0} for m in messages],
             "nextForwardToken": token, "nextBackwardToken": "b"}
    return "get_log_events", reply, params


def test_wait_streams_every_hosts_lines_and_ends_with_the_status() -> None:
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    logs = boto3.client("logs", region_name="us-east-1")
    streams = {"logStreams": [{"logStreamName": f"{JOB}/algo-2-1764547200"},
                              {"logStreamName": f"{JOB}/algo-1-1764547200"}]}
    list_streams = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{JOB}/"}
    one, two = f"{JOB}/algo-1-1764547200", f"{JOB}/algo-2-1764547200"
    printed: list[str] = []
    with Stubber(sagemaker) as sm, Stubber(logs) as cw:
        sm.add_response("describe_training_job", described("InProgress"), {"TrainingJobName": JOB})
        cw.add_client_error("describe_log_streams", "ResourceNotFoundException",
                            expected_params=list_streams)  # no host has logged yet
        sm.add_response("describe_training_job", described("InProgress"), {"TrainingJobName": JOB})
        cw.add_response("describe_log_streams", streams, list_streams)
        for call in (events(one, ["[algo-1 env-host] up", "[algo-1 worker-0] ready"], "f1"),
                     events(one, [], "f1", after="f1"),
                     events(two, ["[algo-2 learner] step 1,024"], "g1"),
                     events(two, [], "g1", after="g1")):
            cw.add_response(*call)
        sm.add_response("describe_training_job",
                        described("Failed", FailureReason="algo-2: learner failed"),
                        {"TrainingJobName": JOB})
        cw.add_response("describe_log_streams", streams, list_streams)
        for call in (events(one, ["[algo-1 env-host] stopped"], "f2", after="f1"),
                     events(one, [], "f2", after="f2"),
                     events(two, [], "g1", after="g1")):
            cw.add_response(*call)
        status = follow(sagemaker, logs, JOB, echo=printed.append, sleep=lambda _: None)
        sm.assert_no_pending_responses()
        cw.assert_no_pending_responses()
    assert status == "Failed"
    assert printed == ["[algo-1 env-host] up", "[algo-1 worker-0] ready",
                       "[algo-2 learner] step 1,024", "[algo-1 env-host] stopped",
                       f"hetrl: job {JOB}: Failed: algo-2: learner failed"]


def _tar(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _object(data: bytes) -> dict:
    return {"Body": StreamingBody(io.BytesIO(data), len(data)), "ContentLength": len(data)}


def test_fetch_downloads_model_output_and_checkpoints_and_writes_the_report(
        tmp_path: Path) -> None:
    summary = {"env": "CartPole-v1", "outcome": "finished", "global_step": 4096,
               "wall_seconds": 8.0, "workers": ["10.0.0.1:7100", "10.0.0.3:7100"]}
    model = _tar({"summary.json": json.dumps(summary), "model.safetensors": "weights",
                  "metrics.jsonl": json.dumps({"global_step": 4096}) + "\n",
                  "cluster.json": json.dumps({"instances": [
                      {"group": "env_group", "instance_type": "ml.c5.9xlarge", "count": 2},
                      {"group": "learner_group", "instance_type": "ml.g5.2xlarge",
                       "count": 1}]})})
    output = _tar({"data/algo-1/worker-0.log": "w\n", "data/algo-2/learner.log": "l\n"})
    checkpoints = f"s3://bucket/runs/{JOB}/checkpoints"
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    s3 = boto3.client("s3", region_name="us-east-1")
    key = f"runs/{JOB}"
    with Stubber(sagemaker) as sm, Stubber(s3) as st:
        sm.add_response("describe_training_job", described(
            "Stopped", CheckpointConfig={"S3Uri": checkpoints}), {"TrainingJobName": JOB})
        st.add_response("get_object", _object(model),
                        {"Bucket": "bucket", "Key": f"{key}/output/model.tar.gz"})
        st.add_response("get_object", _object(output),
                        {"Bucket": "bucket", "Key": f"{key}/output/output.tar.gz"})
        st.add_response("list_objects_v2", {"Contents": [
            {"Key": f"{key}/checkpoints/ckpt-000000004096.pt"},
            {"Key": f"{key}/checkpoints/final/model.safetensors"}], "IsTruncated": False},
            {"Bucket": "bucket", "Prefix": f"{key}/checkpoints/"})
        st.add_response("get_object", _object(b"ckpt"),
                        {"Bucket": "bucket", "Key": f"{key}/checkpoints/ckpt-000000004096.pt"})
        st.add_response("get_object", _object(b"final"),
                        {"Bucket": "bucket", "Key": f"{key}/checkpoints/final/model.safetensors"})
        out = fetch(sagemaker, s3, FetchSettings(job=JOB, out=str(tmp_path / "job")))
        sm.assert_no_pending_responses()
        st.assert_no_pending_responses()
    assert (out / "model" / "model.safetensors").read_text() == "weights"
    assert (out / "output" / "data" / "algo-1" / "worker-0.log").read_text() == "w\n"
    assert (out / "checkpoints" / "ckpt-000000004096.pt").read_bytes() == b"ckpt"
    assert (out / "checkpoints" / "final" / "model.safetensors").read_bytes() == b"final"
    report = (out / "model" / "report" / "report.md").read_text()
    assert "4,096" in report and "ml.g5.2xlarge" in report


def test_fetch_refuses_a_running_job(tmp_path: Path) -> None:
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    with Stubber(sagemaker) as sm:
        sm.add_response("describe_training_job", described("InProgress"),
                        {"TrainingJobName": JOB})
        with pytest.raises(ConfigError, match="is InProgress: fetch it once it has ended"):
            fetch(sagemaker, None, FetchSettings(job=JOB, out=str(tmp_path)))
