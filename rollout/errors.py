"""The one error hierarchy of hetrl.

Every error hetrl raises on purpose derives from `HetrlError`; each message says what
went wrong and what the user can do about it. `learner` and `launch` import from here
(the lowest room that raises), so a caller can catch all of them with one clause.
"""

from __future__ import annotations


class HetrlError(Exception):
    """Base class of every error hetrl raises on purpose."""


class ConfigError(HetrlError, ValueError):
    """A setting is out of range or inconsistent; the message names the flag to fix."""


class EnvError(HetrlError):
    """The environment cannot be imported, made, or has a space hetrl cannot train on."""


class EnvUnhealthyError(EnvError):
    """An env kept failing (raising, or returning NaN/Inf) after being recreated; the
    message carries the env's last traceback."""


class EnvShapeError(EnvUnhealthyError):
    """An env returned an observation whose shape is not its observation space's; a bug
    in the env that recreating it cannot fix, so it ends the worker as unhealthy."""


class NonFiniteError(HetrlError, ValueError):
    """NaN or Inf in observations, rewards or weights under --nonfinite fail."""


class OutputError(HetrlError):
    """An output (model, checkpoint, summary) could not be written: the message names
    the file, its directory, the bytes it needed and the bytes free there."""


class WireFormatError(HetrlError, ValueError):
    """A message on the wire is malformed (bad dtype, shape or size)."""


class ProtocolError(HetrlError):
    """A peer broke the stream protocol (wrong first message, mismatched env, ...)."""


class WorkerLostError(HetrlError):
    """Every worker stream is gone and none came back within the allowed time."""


class ChildFailedError(HetrlError):
    """A process started by the launcher exited with an error."""
