"""hetrl: reinforcement learning with env simulation on CPU hosts and the learner on a GPU.

The repository root is the `hetrl` package; its four rooms are subpackages, imported
one way only: `hetrl.protos` <- `hetrl.rollout` <- `hetrl.learner` <- `hetrl.launch`.
`from hetrl import run_local` is the Python entry point (loaded on first use, so that
`import hetrl.rollout.worker` in a worker process pulls in nothing of the launcher).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetrl.launch.local import RunResult, run_local

__all__ = ["RunResult", "run_local"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hetrl.launch import local

        return getattr(local, name)
    raise AttributeError(f"module 'hetrl' has no attribute {name!r}")
