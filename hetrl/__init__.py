"""hetrl: reinforcement learning with env simulation on CPU hosts and the learner on a GPU.

This folder is the package; its four rooms are top-level folders of the checkout, linked
here as subpackages (docs/how-it-works.md, "Layout"), and imported one way only:
`hetrl.protos` <- `hetrl.rollout` <- `hetrl.learner` <- `hetrl.launch`.
`from hetrl import run_local, load_policy` are the Python entry points (loaded on first
use, so that `import hetrl.rollout.worker` in a worker process pulls in nothing else).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetrl.launch.local import RunResult, run_local
    from hetrl.rollout.evaluate import evaluate, load_policy

__all__ = ["RunResult", "evaluate", "load_policy", "run_local"]
_HOMES = {"RunResult": "hetrl.launch.local", "run_local": "hetrl.launch.local",
          "load_policy": "hetrl.rollout.evaluate", "evaluate": "hetrl.rollout.evaluate"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'hetrl' has no attribute {name!r}")
