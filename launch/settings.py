"""Settings of the launcher roles. Fields are documented once; the CLI comes from here."""

from __future__ import annotations

import dataclasses

from learner.settings import OutputSettings, TrainSettings
from rollout.settings import (
    EnvSettings,
    PolicySettings,
    RolloutSettings,
    _chain_post_init,
    require,
)


@dataclasses.dataclass
class LocalSettings(EnvSettings, PolicySettings, RolloutSettings, TrainSettings, OutputSettings):
    """`hetrl local`: rollout workers and a learner as separate processes on this machine."""

    workers: int = 2
    """Rollout worker processes (one per spare core is a good start)."""
    startup_timeout: float = 120.0
    """Seconds a worker may take to start listening before the run is abandoned."""
    shutdown_grace: float = 20.0
    """Seconds children get to exit after training ends or a stop, before SIGKILL."""

    def __post_init__(self) -> None:
        require(self.workers >= 1, f"--workers must be >= 1, got {self.workers}")
        require(self.startup_timeout > 0, "--startup-timeout must be > 0")
        require(self.shutdown_grace > 0, "--shutdown-grace must be > 0")
        _chain_post_init(self, LocalSettings)
