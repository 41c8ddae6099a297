"""A submitted SageMaker job, followed up: `hetrl submit --wait` and `hetrl fetch JOB`.

`follow` streams the job's CloudWatch log events (every host's stream; each line already
carries its `[host role]` prefix) while it polls DescribeTrainingJob, and ends with the
job's status and failure reason. `fetch` downloads a finished job's model.tar.gz,
output.tar.gz (each host's logs) and checkpoints, unpacks them and writes the run
report locally. Both take plain boto3 clients, so tests drive them with botocore's
Stubber; nothing here imports the sagemaker SDK, and nothing here trains.
"""

from __future__ import annotations

import dataclasses
import logging
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import tyro

from hetrl.rollout.errors import ConfigError
from hetrl.rollout.settings import require

log = logging.getLogger(__name__)

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TERMINAL = ("Completed", "Failed", "Stopped")


@dataclasses.dataclass
class FetchSettings:
    """`hetrl fetch JOB`: download a job's model, output and checkpoints; write its report."""

    job: Annotated[str, tyro.conf.Positional]
    """Training job name, as `hetrl submit` printed it."""
    region: str = ""
    """AWS region of the job; empty: your AWS configuration's default."""
    out: str = ""
    """Local folder to download into; empty: ./<job name>."""
    checkpoints: bool = True
    """Also download the job's checkpoints (to resume it locally or elsewhere)."""

    def __post_init__(self) -> None:
        require(bool(self.job.strip()), "give the training job's name")


def follow(sagemaker: Any, logs: Any, job: str, poll: float = 15.0,
           echo: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
           ) -> str:
    """Print the job's log lines as they arrive until it ends; return its final status
    (Completed, Failed or Stopped), printed last with the failure reason if any."""
    tokens: dict[str, str | None] = {}
    while True:
        described = sagemaker.describe_training_job(TrainingJobName=job)
        status = described["TrainingJobStatus"]
        _drain(logs, job, tokens, echo)
        if status in TERMINAL:
            reason = described.get("FailureReason", "")
            echo(f"hetrl: job {job}: {status}" + (f": {reason}" if reason else ""))
            return status
        sleep(poll)


def _drain(logs: Any, job: str, tokens: dict[str, str | None],
           echo: Callable[[str], None]) -> None:
    """Print every new event of every log stream of `job` (streams appear as hosts start)."""
    try:
        streams = logs.describe_log_streams(logGroupName=LOG_GROUP,
                                            logStreamNamePrefix=f"{job}/")["logStreams"]
    except logs.exceptions.ResourceNotFoundException:
        return  # no host has logged yet
    for stream in sorted(s["logStreamName"] for s in streams):
        while True:
            kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": stream,
                                      "startFromHead": True}
            if tokens.get(stream):
                kwargs["nextToken"] = tokens[stream]
            reply = logs.get_log_events(**kwargs)
            for event in reply["events"]:
                echo(event["message"].rstrip("\n"))
            if reply["nextForwardToken"] == tokens.get(stream):
                break  # no more events for now
            tokens[stream] = reply["nextForwardToken"]


def fetch(sagemaker: Any, s3: Any, settings: FetchSettings) -> Path:
    """Download and unpack the job's artifacts under `settings.out`; return that folder.

    Raises:
        ConfigError: the job has not finished, or has no artifacts.
    """
    described = sagemaker.describe_training_job(TrainingJobName=settings.job)
    status = described["TrainingJobStatus"]
    require(status in TERMINAL, f"job {settings.job} is {status}: fetch it once it has ended "
            "(hetrl submit --wait, or the SageMaker console)")
    out = Path(settings.out or settings.job)
    model_uri = described.get("ModelArtifacts", {}).get("S3ModelArtifacts", "")
    require(bool(model_uri), f"job {settings.job} ({status}) left no model artifacts")
    output_uri = model_uri.rsplit("/", 1)[0] + "/output.tar.gz"
    for uri, into in ((model_uri, out / "model"), (output_uri, out / "output")):
        archive = out / uri.rsplit("/", 1)[1]
        if _download(s3, uri, archive):
            _unpack(archive, into)
    checkpoint_uri = described.get("CheckpointConfig", {}).get("S3Uri", "")
    if settings.checkpoints and checkpoint_uri:
        count = _download_prefix(s3, checkpoint_uri, out / "checkpoints")
        log.info("%d checkpoint files from %s", count, checkpoint_uri)
    from hetrl.launch.report import try_write_report

    try_write_report(out / "model")
    return out


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _download(s3: Any, uri: str, path: Path) -> bool:
    """Copy one S3 object to `path`; False (with a line saying so) when it does not exist."""
    bucket, key = _split(uri)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    except s3.exceptions.NoSuchKey:
        log.warning("%s does not exist; skipped", uri)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        for chunk in iter(lambda: body.read(1 << 20), b""):
            file.write(chunk)
    log.info("downloaded %s", uri)
    return True


def _download_prefix(s3: Any, uri: str, into: Path) -> int:
    bucket, prefix = _split(uri.rstrip("/") + "/")
    count = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix):]
            if relative and ".." not in Path(relative).parts:
                count += _download(s3, f"s3://{bucket}/{item['Key']}", into / relative)
    return count


def _unpack(archive: Path, into: Path) -> None:
    """Unpack a job archive, refusing members that would land outside `into`."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            target = (into / member.name).resolve()
            if not target.is_relative_to(into.resolve()) or not (member.isfile()
                                                                 or member.isdir()):
                raise ConfigError(f"{archive} holds {member.name!r}, which is not a plain "
                                  "file inside it; not unpacking it")
            members.append(member)
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse what is unsafe too
            tar.extractall(into, members=members, filter="data")
        else:
            tar.extractall(into, members=members)


def run_fetch(settings: FetchSettings) -> int:
    """`hetrl fetch`: print where the job's files and report went; 0."""
    import boto3

    session = boto3.Session(region_name=settings.region or None)
    out = fetch(session.client("sagemaker"), session.client("s3"), settings)
    print(f"hetrl: job {settings.job} fetched into {out} (report: {out / 'model' / 'report'})")
    return 0
