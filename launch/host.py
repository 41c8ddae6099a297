"""The single entry point of every host in a cluster job (`hetrl launch`, `python -m
launch.host`, or the `launcher.py` SageMaker runs).

It reads the cluster (launch.cluster), builds ClusterSettings from the job's
hyperparameters (then any command-line flags), and branches on the host's instance
group: env groups run `run_env_host`, the learner group runs `run_learner_host`; a
homogeneous job (one group, e.g. a single GPU instance) runs the local mode on its one
host. Any failure is written to `<base>/output/failure` before a non-zero exit.

A job stop reaches a host only as SIGTERM to the container's PID 1, so this process must
be PID 1 (the job's command execs it); a host under SageMaker that is not says so. Its
lines and its children's reach the container's stdout prefixed `[host role]` (only
that reaches CloudWatch), and their log files are copied to `<base>/output/data/<host>/`
at exit (see launch.logs).
"""

from __future__ import annotations

import logging
import os
import sys

from hetrl.launch import flags
from hetrl.launch.cluster import ClusterView, read_cluster
from hetrl.launch.hyperparameters import from_hyperparameters
from hetrl.launch.settings import ClusterSettings, LocalSettings, flags_given
from hetrl.rollout.errors import ConfigError, HetrlError
from hetrl.rollout.exits import EXIT_BAD_CONFIG, EXIT_FAILED, EXIT_OK
from hetrl.rollout.lifetime import LOG_FORMAT, catch_stop_early, die_with_parent
from hetrl.rollout.settings import pick
from hetrl.rollout.transport import token_from_env
from hetrl.rollout.userpath import user_modules_importable

log = logging.getLogger("hetrl.host")


def settings_for(cluster: ClusterView, argv: list[str]) -> ClusterSettings:
    """Hyperparameters of the job over the defaults, then command-line flags over both."""
    from hetrl.launch.presets import announce, apply_preset

    try:
        given = from_hyperparameters(cluster.hyperparameters, ClusterSettings)
        base = ClusterSettings(**given)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"hyperparameters: {exc}") from exc
    if argv:
        base = flags.parse(ClusterSettings, argv, prog="hetrl launch", default=base,
                           description=ClusterSettings.__doc__ or "")
    # Every host applies the same preset; hyperparameters and flags win over it.
    settings, line = apply_preset(base, set(given) | flags_given(argv, ClusterSettings))
    announce(line)
    return settings


def run_host(settings: ClusterSettings, cluster: ClusterView) -> int:
    """Run this host's role; return its exit code."""
    from hetrl.launch.env_host import run_env_host
    from hetrl.launch.learner_host import run_learner_host

    token = token_from_env()
    group = cluster.current_group
    known = (*settings.env_groups, settings.learner_group)
    if not cluster.is_hetero or len(cluster.groups) == 1:
        log.info("homogeneous job: running the local mode on %s", cluster.current_host)
        return _run_homogeneous(settings, cluster)
    if group in settings.env_groups:
        return run_env_host(settings, cluster, token)
    if group == settings.learner_group:
        return run_learner_host(settings, cluster, token)
    raise ConfigError(
        f"this host's instance group {group!r} is neither an env group {settings.env_groups} "
        f"nor the learner group {settings.learner_group!r}; set the env_groups / "
        f"learner_group hyperparameters to the group names of the job ({sorted(cluster.groups)}"
        f", known: {known})"
    )


def _run_homogeneous(settings: ClusterSettings, cluster: ClusterView) -> int:
    from hetrl.launch.cluster import usable_cores
    from hetrl.launch.local import run_prepared

    hosts = cluster.groups.get(cluster.current_group, [cluster.current_host])
    if len(hosts) > 1 and cluster.current_host != hosts[0]:
        log.info("homogeneous job with %d hosts: only %s trains; this host idles out",
                 len(hosts), hosts[0])
        return EXIT_OK
    workers = settings.workers_per_env_host or max(1, usable_cores() - settings.learner_cores)
    local = pick(LocalSettings, settings, workers=workers, out=str(cluster.model_dir))
    return run_prepared(local).exit_code


def warn_unless_pid_1(pid: int | None = None) -> bool:
    """Under SageMaker (TRAINING_JOB_NAME set), warn when this process is not PID 1: the
    job's stop (SIGTERM to PID 1) then may not reach it. Return whether it warned."""
    pid = os.getpid() if pid is None else pid
    if pid == 1 or not os.environ.get("TRAINING_JOB_NAME"):
        return False
    log.warning("this host runs as PID %d, not PID 1 of its container: a job stop or spot "
                "interruption (SIGTERM to PID 1) may never reach it, so there would be no "
                "final checkpoint. Start it with `exec python3 launcher.py`.", pid)
    return True




def role_of(cluster: ClusterView, settings: ClusterSettings | None) -> str:
    """This host's role as its log prefix names it: env-host, learner or host."""
    if settings is not None and cluster.is_hetero and len(cluster.groups) > 1:
        if cluster.current_group in settings.env_groups:
            return "env-host"
        if cluster.current_group == settings.learner_group:
            return "learner"
    return "host"


def main(argv: list[str] | None = None) -> int:
    catch_stop_early()  # a SIGTERM before the role's own handler is kept, not lost
    die_with_parent()  # first: no host process outlives whoever started it
    user_modules_importable()  # after hetrl: the user's --env / --policy modules
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    warn_unless_pid_1()
    argv = sys.argv[1:] if argv is None else argv
    cluster: ClusterView | None = None
    settings: ClusterSettings | None = None
    try:
        cluster = read_cluster()
        try:
            settings = settings_for(cluster, argv)
        finally:  # every line from here on: [host role] on stdout, and in a file
            _tee_output(cluster, settings)
        return run_host(settings, cluster)
    except HetrlError as exc:
        log.error("%s", exc)
        if cluster is not None:
            from hetrl.launch.env_host import write_failure

            write_failure(cluster, f"{cluster.current_host}: {exc}")
        return EXIT_BAD_CONFIG if isinstance(exc, ConfigError) else EXIT_FAILED
    finally:
        if cluster is not None:
            from hetrl.launch.logs import keep_logs

            sys.stdout.flush()
            sys.stderr.flush()
            keep_logs(cluster.base_dir, cluster.current_host)


def _tee_output(cluster: ClusterView, settings: ClusterSettings | None) -> None:
    from hetrl.launch.logs import tee_host_output

    role = role_of(cluster, settings)
    tee_host_output(f"[{cluster.current_host} {role}] ",
                    cluster.base_dir / "hetrl" / "logs" / f"{role}.log")
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, force=True)  # new stderr


if __name__ == "__main__":
    raise SystemExit(main())
