"""The exit codes of every hetrl process: workers, learner, hosts and launchers.

One table, read by the processes that exit with a code and by the supervisors that act
on it (launch.supervisor restarts a worker on any code but OK and UNHEALTHY). It lives in
rollout, the lowest room whose processes exit with these codes, and imports nothing, so
a launcher reads it without loading torch or gRPC. It decides nothing itself.
"""

from __future__ import annotations

EXIT_OK = 0
"""Finished, or stopped as asked: a learner that checkpointed on a stop has succeeded."""
EXIT_FAILED = 1
"""Failed; the reason is in the log (and, on a cluster host, in <base>/output/failure)."""
EXIT_BAD_CONFIG = 2
"""A cluster host's settings or hyperparameters are wrong; nothing was started."""
EXIT_NO_LEARNER = 3
"""A worker saw no learner for --learner-timeout (its dead-man's switch)."""
EXIT_UNHEALTHY = 4
"""A worker's env keeps failing after being recreated: a restart would fail the same way."""
EXIT_HUNG = 5
"""A worker's env call outlived --step-timeout; its watchdog ended it for a restart."""
EXIT_ENV_BROKEN = 6
"""A worker's env breaks its own contract (an observation not of its space's shape): a
bug in the env, which no restart fixes."""
EXIT_INTERRUPTED = 130
"""A launcher stopped by Ctrl-C (or by a SIGTERM some child did not honour), as shells
report SIGINT."""
