"""Submission of a hetrl run as one SageMaker heterogeneous-cluster training job.

Turns `SubmitSettings` into a sagemaker SDK v3 `ModelTrainer` (an env instance group and a
learner instance group, hetrl's code staged with the user's, hyperparameters, checkpoints,
optional spot) and creates the job, or with --dry-run prints the CreateTrainingJob request.
The dry run drives the very SDK path of a real submission, offline: boto clients whose
botocore `before-call` hook answers every call AccessDenied before anything is signed or
sent, an S3 upload that only computes its URI, and CreateTrainingJob stopped after botocore
has validated it against the service model; its JSON body is what is printed. So the
printed request is the SDK's own, not a hand-written mirror that could drift. This module
must not run training, must not be imported on the hosts, and must not import the SDK at
module level: the SDK is the optional extra `hetrl[sagemaker]`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hetrl.launch.hyperparameters import to_hyperparameters
from hetrl.launch.settings import ClusterSettings, InstanceTypes
from hetrl.rollout.errors import ConfigError
from hetrl.rollout.settings import _chain_post_init, require

log = logging.getLogger(__name__)

PACKAGE = "hetrl"
"""hetrl's own package (the rooms under it), copied into the job's code directory."""
ENTRY_SCRIPT = "launcher.py"
LAUNCHER = '''"""Entry point of every host of this hetrl job. SageMaker runs it as `exec python3
launcher.py`, so this process is the container's PID 1 and receives the job's SIGTERM."""
from hetrl.rollout.lifetime import catch_stop_early

catch_stop_early()  # before the heavy imports: a SIGTERM to PID 1 without a handler is lost
from hetrl.launch.host import main  # noqa: E402

raise SystemExit(main())
'''
# `exec`: sm_train.sh runs the command with `eval "$CMD"` followed by an `echo`, so without
# it bash forks the command and stays PID 1, and bash as PID 1 drops the stop's SIGTERM.
COMMAND = f"exec python3 {ENTRY_SCRIPT}"
REQUIREMENTS = "requirements.txt"
_RESERVED = (PACKAGE, ENTRY_SCRIPT, REQUIREMENTS)
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".git")
_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/\S+")
_S3_URI = re.compile(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?")
_JOB_PREFIX = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
SAGEMAKER_STOP_WINDOW = 120.0
"""Seconds between a stop's SIGTERM and SageMaker's SIGKILL (stop, spot interruption)."""
STOP_BUDGET_MAX = 100.0
"""Largest --stop-budget a job accepts: leaves 20 s of SageMaker's window for the S3 sync."""
MIN_VOLUME_GB = 25
"""Volume the resolved AWS PyTorch training image needs (an estimate: the GPU images
unpack to roughly 20 GB); with --image, the user knows their image."""
_JOB_PREFIX_MAX = 63 - 15  # the SDK appends -YYYYmmddHHMMSS to the 63-character name


@dataclasses.dataclass
class SubmitSettings(InstanceTypes, ClusterSettings):
    """`hetrl submit`: create the SageMaker job; training flags reach its hosts as
    hyperparameters (see `hyperparameters`)."""

    role: str = ""
    """IAM role ARN the job runs as (arn:aws:iam::ACCOUNT:role/NAME)."""
    region: str = ""
    """AWS region of the job, e.g. us-east-1."""
    image: str = ""
    """Training image URI; empty resolves the AWS PyTorch training image for --region."""
    pytorch_version: str = "2.8"
    """PyTorch version of the resolved image (ignored with --image)."""
    python_version: str = "py312"
    """Python version tag of the resolved image, e.g. py312 (ignored with --image)."""
    env_count: int = 1
    """Number of env hosts."""
    output: str = ""
    """S3 URI under which the job writes its model and output, and its code is staged."""
    spot: bool = False
    """Run on managed spot capacity (checkpoints let an interrupted job resume)."""
    max_run: int = 86_400
    """Seconds the job may run before SageMaker stops it."""
    max_wait: int = 0
    """With --spot: seconds of spot wait plus run time, > --max-run; 0 is twice --max-run."""
    checkpoint_s3: str = ""
    """S3 URI synced with --checkpoint-dir; empty is a new folder per job under --output."""
    source_dir: str = ""
    """Your code directory (custom env modules...), merged at the top of the job's code."""
    requirements: str = ""
    """Requirements file inside --source-dir, installed on every host."""
    no_requirements: bool = False
    """Install nothing at start: the image (--image) already has hetrl's dependencies and
    yours (see launch/Dockerfile); needed where hosts have no internet access."""
    job_name: str = ""
    """Job name prefix (a timestamp is appended); empty is hetrl-<env>."""
    volume_size_gb: int = 30
    """Storage volume of each host, in GB."""
    dry_run: bool = False
    """Print the CreateTrainingJob request as JSON and send nothing (no credentials needed)."""
    verbose: bool = False
    """Also show the sagemaker SDK's and botocore's own log lines (secrets masked)."""
    wait: bool = False
    """After creating the job, print its hosts' log lines until it ends, then its status;
    exit 0 only if it Completed."""

    def __post_init__(self) -> None:
        require(bool(_ROLE_ARN.fullmatch(self.role)),
                f"--role must be an IAM role ARN like arn:aws:iam::123456789012:role/Name, "
                f"got {self.role!r}")
        require(bool(re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+", self.region)),
                f"--region must name an AWS region like us-east-1, got {self.region!r}")
        self.output = self.output.rstrip("/")
        require(bool(_S3_URI.fullmatch(self.output)),
                f"--output must be an S3 URI like s3://bucket/prefix, got {self.output!r}")
        require(not self.checkpoint_s3 or bool(_S3_URI.fullmatch(self.checkpoint_s3)),
                f"--checkpoint-s3 must be an S3 URI, got {self.checkpoint_s3!r}")
        require(self.env_count >= 1, f"--env-count must be >= 1, got {self.env_count}")
        require(len(tuple(self.env_groups)) == 1,
                "hetrl submit creates one env instance group: give a single --env-groups name")
        require(self.max_run >= 1, f"--max-run must be >= 1, got {self.max_run}")
        if self.spot:
            require(self.spot_max_wait > self.max_run,
                    f"--max-wait ({self.max_wait}) must exceed --max-run ({self.max_run}) "
                    "with --spot, or be 0 for twice --max-run")
        else:
            require(self.max_wait == 0, "--max-wait applies only with --spot")
        require(not (self.wait and self.dry_run), "--wait needs a real job: drop --dry-run")
        require(self.volume_size_gb >= 1, "--volume-size-gb must be >= 1")
        require(self.stop_budget <= STOP_BUDGET_MAX,
                f"--stop-budget must be <= {STOP_BUDGET_MAX:.0f} s, got {self.stop_budget:g}: "
                f"SageMaker kills every host {SAGEMAKER_STOP_WINDOW:.0f} s after a stop's "
                "SIGTERM, and the final checkpoint still has to reach S3")
        require(not self.job_name or (len(self.job_name) <= _JOB_PREFIX_MAX
                                      and bool(_JOB_PREFIX.fullmatch(self.job_name))),
                f"--job-name must be letters, digits and hyphens, at most {_JOB_PREFIX_MAX} "
                f"characters, got {self.job_name!r}")
        require(not self.source_dir or Path(self.source_dir).is_dir(),
                f"--source-dir {self.source_dir!r} is not a directory")
        require(not (self.no_requirements and self.requirements),
                "--no-requirements and --requirements exclude each other")
        require(not self.requirements or (bool(self.source_dir) and (
            Path(self.source_dir) / self.requirements).is_file()),
                f"--requirements {self.requirements!r} must name a file inside --source-dir")
        _chain_post_init(self, SubmitSettings)

    @property
    def spot_max_wait(self) -> int:
        """MaxWaitTimeInSeconds of a spot job: --max-wait, or twice --max-run when 0."""
        return self.max_wait or 2 * self.max_run


# Env ids whose simulator is an optional gymnasium extra, and requirement names that
# install it (a line naming one of them, e.g. gymnasium[mujoco]>=1.0 or ale-py).
_ENV_EXTRAS = {
    "MuJoCo": (re.compile(r"(Ant|HalfCheetah|Hopper|Humanoid|HumanoidStandup|"
                          r"InvertedPendulum|InvertedDoublePendulum|Pusher|Reacher|Swimmer|"
                          r"Walker2d)-v\d+"), ("gymnasium[mujoco]", "mujoco"),
               "gymnasium[mujoco]>=1.1,<2"),
    # The Atari pipeline (--atari, the atari preset) resizes frames with OpenCV.
    "Atari": (re.compile(r"ALE/.+"), ("gymnasium[atari]", "ale-py", "ale_py"),
              "ale-py>=0.9' and 'opencv-python-headless>=4.8"),
}


def check_on_aws_terms(settings: SubmitSettings) -> list[str]:
    """Refuse now what would fail later on the hosts; return warnings it also logged.

    Raises:
        ConfigError: an instance type SageMaker training does not offer (botocore's
            service model lists them), a hyperparameter sm_train.sh cannot pass, or a
            volume too small for the image.
    """
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    offered = set(model.shape_for("TrainingInstanceType").enum)
    for flag, value in (("--env-type", settings.env_type),
                        ("--learner-type", settings.learner_type)):
        if value not in offered:
            near = difflib.get_close_matches(value, sorted(offered), n=3)
            raise ConfigError(f"{flag} {value} is not a SageMaker training instance type"
                              + (f"; did you mean {', '.join(near)}?" if near else ""))
    to_hyperparameters(settings)  # raises on a ' or an over-long value
    minimum = MIN_VOLUME_GB if not settings.image else 1
    require(settings.volume_size_gb >= minimum,
            f"--volume-size-gb {settings.volume_size_gb} is too small: the AWS PyTorch "
            f"training image needs about {MIN_VOLUME_GB} GB on each host")
    warnings = []
    if not settings.no_requirements:
        lines = requirement_lines(settings)
        for name, (pattern, installers, line) in _ENV_EXTRAS.items():
            if pattern.fullmatch(settings.env) and not any(
                    line_.lower().startswith(installer) for line_ in lines
                    for installer in installers):
                warnings.append(f"--env {settings.env} needs {name} on every host, and no "
                                f"requirements line installs it: add '{line}' to your "
                                "--requirements file (or use an --image that has it with "
                                "--no-requirements)")
    for warning in warnings:
        log.warning("%s", warning)
    return warnings


def job_prefix(settings: SubmitSettings) -> str:
    """Base job name: --job-name, or hetrl-<env id> made name-safe."""
    prefix = settings.job_name or "hetrl-" + re.sub(r"[^a-zA-Z0-9]+", "-", settings.env)
    return prefix[:_JOB_PREFIX_MAX].strip("-")


def runtime_requirements() -> list[str]:
    """hetrl's runtime dependencies but torch (the image has it), without extras.

    Read from the installed metadata, which pip generates from pyproject's
    [project].dependencies: works for editable and wheel installs, and without tomllib.

    Raises:
        ConfigError: hetrl is not installed.
    """
    try:
        requires = importlib.metadata.requires("hetrl") or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise ConfigError("hetrl is not installed: pip install -e . (or the wheel)") from exc
    return [line for line in requires if "extra ==" not in line
            and re.split(r"[^A-Za-z0-9._-]", line.strip(), maxsplit=1)[0].lower() != "torch"]


def requirement_lines(settings: SubmitSettings) -> list[str]:
    """The job's requirements.txt: hetrl's runtime dependencies, then --requirements."""
    lines = runtime_requirements()
    if settings.requirements:
        lines += (Path(settings.source_dir) / settings.requirements).read_text().splitlines()
    return lines


def stage_code(settings: SubmitSettings, into: Path) -> None:
    """Fill `into` with the job's code: hetrl's packages, launcher.py, requirements.txt
    (hetrl's runtime dependencies, then the lines of --requirements) and the contents of
    --source-dir merged at the top, so user modules import by their own names (the code
    directory is the entry script's working directory) and relative paths still hold.

    Raises:
        ConfigError: --source-dir holds a top-level name hetrl needs for itself.
    """
    _copy_package(into / PACKAGE)
    if settings.source_dir:
        source = Path(settings.source_dir)
        allowed = {REQUIREMENTS} if Path(settings.requirements) == Path(REQUIREMENTS) else set()
        clashes = sorted((set(_RESERVED) - allowed) & {e.name for e in source.iterdir()})
        require(not clashes, f"--source-dir {source} has {', '.join(clashes)} at its top, "
                "which hetrl's job code uses: rename or move them (a requirements.txt "
                "there is fine when passed as --requirements)")
        shutil.copytree(source, into, ignore=_IGNORE, dirs_exist_ok=True)
    if not settings.no_requirements:
        (into / REQUIREMENTS).write_text("\n".join(requirement_lines(settings)) + "\n")
    (into / ENTRY_SCRIPT).write_text(LAUNCHER)


def build_request(settings: SubmitSettings,
                  channels_into: Path | None = None) -> dict[str, Any]:
    """The CreateTrainingJob request of `settings` as the SDK builds it, with a fresh
    HETRL_TOKEN; needs neither credentials nor network, and sends nothing. With
    `channels_into`, the local folders the SDK would upload (channels `code` and
    `sm_drivers`, the latter holding its sm_train.sh) are copied there, one per channel.

    Raises:
        ConfigError: the SDK is missing, or it or botocore refuses the settings.
    """
    return _drive(settings, dry_run=True, channels_into=channels_into)


def submit(settings: SubmitSettings) -> str:
    """Create the training job (without waiting for it) and return its name.

    Raises:
        ConfigError: the SDK or AWS credentials are missing, or SageMaker refuses the job.
    """
    return _drive(settings, dry_run=False)["TrainingJobName"]


def run_submit(settings: SubmitSettings) -> int:
    """`hetrl submit`: print the dry-run request (JSON, secrets masked) or the created
    job's name (then with --wait its logs and status); the exit code."""
    if settings.dry_run:
        request = mask_secrets(build_request(settings))
        print(json.dumps(request, indent=2, sort_keys=True, default=str))
        return 0
    job = submit(settings)
    print(job, flush=True)
    if not settings.wait:
        return 0
    import boto3

    from hetrl.launch.jobs import follow

    session = boto3.Session(region_name=settings.region)
    status = follow(session.client("sagemaker"), session.client("logs"), job)
    return 0 if status == "Completed" else 1


MASK = "******"
"""What a secret shows as wherever hetrl prints or logs it (as the SDK's own drivers do)."""
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL", "PRIVATE")
_SDK_LOGGERS = ("sagemaker", "sagemaker_core", "botocore", "boto3", "s3transfer", "urllib3")


def mask_secrets(request: dict[str, Any]) -> dict[str, Any]:
    """A copy of a CreateTrainingJob request with every environment value whose name
    says it is secret (HETRL_TOKEN, ..._SECRET_..., ..._KEY) replaced by MASK."""
    masked = dict(request)
    if "Environment" in masked:
        masked["Environment"] = {
            key: MASK if any(word in key.upper() for word in _SECRET_WORDS) else value
            for key, value in masked["Environment"].items()}
    return masked


class _MaskFilter(logging.Filter):
    """Replaces the given secrets by MASK in every record a handler emits."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(secret in message for secret in self.secrets):
            for secret in self.secrets:
                message = message.replace(secret, MASK)
            record.msg, record.args = message, None
        return True


@contextlib.contextmanager
def _sdk_logging(verbose: bool, secrets: list[str]) -> Iterator[None]:
    """While the SDK runs: its loggers (and botocore's) silent unless `verbose`, since
    hetrl's own errors already say what failed and what to do; and `secrets` masked in
    whatever any handler emits."""
    names = {name for name in logging.root.manager.loggerDict
             if name.split(".")[0] in _SDK_LOGGERS} | set(_SDK_LOGGERS)
    levels = {name: logging.getLogger(name).level for name in names}
    if not verbose:
        for name in names:
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    loggers = [logging.root, *(logging.getLogger(name) for name in names)]
    handlers = {handler for logger in loggers for handler in logger.handlers}
    mask = _MaskFilter(secrets)
    for handler in handlers:
        handler.addFilter(mask)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(mask)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def build_trainer(settings: SubmitSettings, code_dir: Path, session: Any,
                  token: str = "") -> Any:
    """The sagemaker `ModelTrainer` of `settings`, with `code_dir` as its source code and
    `token` (empty: a fresh one) as the job's HETRL_TOKEN.

    Raises:
        ConfigError: the SDK is missing or no image can be resolved.
    """
    _require_sdk()
    from sagemaker.core.training import configs
    from sagemaker.train.model_trainer import ModelTrainer

    groups = [
        configs.InstanceGroup(instance_group_name=settings.env_groups[0],
                              instance_type=settings.env_type, instance_count=settings.env_count),
        configs.InstanceGroup(instance_group_name=settings.learner_group,
                              instance_type=settings.learner_type,
                              instance_count=settings.learner_count),
    ]
    return ModelTrainer(
        sagemaker_session=session,
        role=settings.role,
        base_job_name=job_prefix(settings),
        training_image=training_image(settings),
        source_code=source_code(settings, code_dir),
        compute=configs.Compute(instance_groups=groups, volume_size_in_gb=settings.volume_size_gb,
                                enable_managed_spot_training=settings.spot),
        stopping_condition=configs.StoppingCondition(
            max_runtime_in_seconds=settings.max_run,
            max_wait_time_in_seconds=settings.spot_max_wait if settings.spot else None),
        output_data_config=configs.OutputDataConfig(s3_output_path=settings.output),
        # An empty S3 URI lets the SDK pick <output>/<base name>/<job name>/checkpoints, so
        # a new job never resumes from an older job's checkpoints by accident.
        checkpoint_config=configs.CheckpointConfig(s3_uri=settings.checkpoint_s3 or None,
                                                   local_path=settings.checkpoint_dir),
        hyperparameters=to_hyperparameters(settings),
        # Visible in clear to whoever may DescribeTrainingJob; hosts mask it in their logs.
        environment={"HETRL_TOKEN": token or secrets.token_urlsafe(32)},
    )


def source_code(settings: SubmitSettings, code_dir: Path) -> Any:
    """The job's `SourceCode`: `code_dir`, its requirements, and the command sm_train.sh runs."""
    _require_sdk()
    from sagemaker.core.training import configs

    # `command`, not `entry_script`: the SDK's script driver would also pass every
    # hyperparameter as `--key value` (lists as "[64, 64]", bools as "false"), which the
    # entry point's flag parser refuses; it reads them from hyperparameters.json instead.
    return configs.SourceCode(
        source_dir=str(code_dir), command=COMMAND,
        requirements=None if settings.no_requirements else REQUIREMENTS)


def training_image(settings: SubmitSettings) -> str:
    """--image, or the AWS PyTorch training image for the region (resolved offline).

    Raises:
        ConfigError: the SDK knows no such image.
    """
    if settings.image:
        return settings.image
    from sagemaker.core import image_uris

    try:
        return image_uris.retrieve(
            "pytorch", region=settings.region, version=settings.pytorch_version,
            py_version=settings.python_version or None, instance_type=settings.learner_type,
            image_scope="training")
    except ValueError as exc:
        raise ConfigError(
            f"no PyTorch training image for --pytorch-version {settings.pytorch_version} "
            f"--python-version {settings.python_version} in {settings.region} ({exc}); "
            "pick others or pass --image URI") from exc


class _Stop(Exception):
    """Ends a dry run at CreateTrainingJob, from botocore's before-call hook."""


class _Capture:
    """botocore before-call hook: keeps CreateTrainingJob's JSON body (already validated
    by botocore); offline, it stops there and answers every other call AccessDenied, unsigned
    and unsent, which the SDK treats like a caller without that permission."""

    def __init__(self, offline: bool) -> None:
        self.offline = offline
        self.request: dict[str, Any] | None = None

    def __call__(self, model: Any, params: dict[str, Any], **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        operation = f"{model.service_model.service_name}.{model.name}"
        if operation == "sagemaker.CreateTrainingJob":
            self.request = json.loads(params["body"])
            if self.offline:
                raise _Stop
            return None
        if not self.offline:
            return None
        log.debug("dry run: answered %s with AccessDenied", operation)
        error = {"Code": "AccessDenied", "Message": f"hetrl dry run: {operation} not sent"}
        return AWSResponse(params["url"], 403, {}, None), {"Error": error}


def _refuse_send(request: Any, **_: Any) -> None:
    raise ConfigError(f"hetrl dry run: refusing to send a request to {request.url}")


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore them."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _drive(settings: SubmitSettings, dry_run: bool,
           channels_into: Path | None = None) -> dict[str, Any]:
    _require_sdk()
    check_on_aws_terms(settings)
    import boto3
    import botocore.session
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
    from sagemaker.core.helper.iam_role_resolver import RoleValidationError

    capture = _Capture(offline=dry_run)
    core = botocore.session.Session()
    if dry_run:
        core.set_credentials("hetrl-dry-run", "hetrl-dry-run")
        core.register("before-send", _refuse_send)
    core.register("before-call", capture)
    boto_session = boto3.Session(botocore_session=core, region_name=settings.region)
    # Offline the SDK's IAM check of --role cannot run: skip it rather than warn.
    skip_role_check = {"SAGEMAKER_VALIDATE_ROLE": "false"} if dry_run else {}
    token = secrets.token_urlsafe(32)
    with (tempfile.TemporaryDirectory(prefix="hetrl-job-") as code_dir,
          _sdk_logging(settings.verbose, [token])):
        stage_code(settings, Path(code_dir))
        try:
            with _environment(skip_role_check):
                trainer = build_trainer(settings, Path(code_dir),
                                        _session(settings, boto_session, dry_run,
                                                 channels_into), token)
            trainer.train(wait=False, logs=False)
        except _Stop:
            pass
        except NoCredentialsError as exc:
            raise ConfigError("no AWS credentials: configure them (aws configure, "
                              "AWS_PROFILE, ...) or use --dry-run") from exc
        except RoleValidationError as exc:
            raise ConfigError(f"--role cannot run the job: {exc}") from exc
        except (BotoCoreError, ClientError) as exc:
            raise ConfigError(f"SageMaker refused the job: {exc}; check the settings, "
                              "--role, --region, your permissions and quotas") from exc
        except ValueError as exc:  # the SDK's own checks (ConfigError passes through)
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"the sagemaker SDK refused the settings: {exc}") from exc
    if capture.request is None:
        raise ConfigError("the sagemaker SDK never called CreateTrainingJob: "
                          "hetrl needs sagemaker>=3.27,<4")
    return capture.request


def _session(settings: SubmitSettings, boto_session: Any, dry_run: bool,
             channels_into: Path | None = None) -> Any:
    """A sagemaker Session that stages code under --output; with dry_run, offline (and
    copying each uploaded folder to channels_into/<channel> when given)."""
    from sagemaker.core.config.config import load_sagemaker_config
    from sagemaker.core.helper.session_helper import Session

    output_bucket, _, prefix = settings.output.removeprefix("s3://").partition("/")
    if not dry_run:
        return Session(boto_session=boto_session, default_bucket=output_bucket,
                       default_bucket_prefix=prefix or None)

    class OfflineSession(Session):
        """Knows its bucket without asking S3; `upload_data` returns the URI, uploads nothing."""

        def default_bucket(self) -> str:
            return output_bucket

        def upload_data(self, path, bucket=None, key_prefix="data", callback=None,
                        extra_args=None):
            bucket, key_prefix = self.determine_bucket_and_prefix(
                bucket=bucket, key_prefix=key_prefix, sagemaker_session=self)
            name = "" if os.path.isdir(path) else "/" + os.path.basename(path)
            if channels_into is not None and os.path.isdir(path):
                channel = key_prefix.rstrip("/").rsplit("/", 1)[-1]
                shutil.copytree(path, channels_into / channel, dirs_exist_ok=True)
            return f"s3://{bucket}/{key_prefix}{name}"

    # The user's SDK defaults apply as in a real submission, plus the SDK's telemetry
    # opt-out (a config key; v3 has no environment variable for it), so nothing phones home.
    config = load_sagemaker_config(s3_resource=boto_session.resource("s3"))
    config.setdefault("SchemaVersion", "1.0")
    sdk = config.setdefault("SageMaker", {}).setdefault("PythonSDK", {})
    sdk.setdefault("Modules", {})["TelemetryOptOut"] = True
    return OfflineSession(boto_session=boto_session, default_bucket=output_bucket,
                          default_bucket_prefix=prefix or None, sagemaker_config=config)


def _require_sdk() -> None:
    try:
        import sagemaker.train.model_trainer  # noqa: F401
    except ImportError as exc:
        raise ConfigError("hetrl submit needs the sagemaker SDK v3: "
                          "pip install 'hetrl[sagemaker]'") from exc


def _copy_package(into: Path) -> None:
    """Copy the installed hetrl package (its __init__, __main__ and rooms) to `into`;
    from a checkout, only those: never its tests, benchmarks or virtual environment."""
    import hetrl

    root = Path(hetrl.__file__).resolve().parent
    into.mkdir(parents=True)
    for name in ("__init__.py", "__main__.py"):
        shutil.copyfile(root / name, into / name)
    for room in ("protos", "rollout", "learner", "launch"):
        if not (root / room / "__init__.py").is_file():
            raise ConfigError(f"cannot find hetrl.{room} under {root}: reinstall hetrl")
        shutil.copytree(root / room, into / room, ignore=_IGNORE)
