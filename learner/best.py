"""The best policy of a run so far, kept beside the final one (model-best.safetensors).

Without periodic evaluation the training return judges: whenever the mean return of the
last 100 training episodes beats every earlier one, the learner's snapshot of those
weights (a copy nobody modifies) is kept, and written when the model is (periodically
and at the end), so a run whose policy degrades after its peak still leaves the peak.
Ties keep the earlier policy: the training mean lags the policy, and the first to reach
a level has since been confirmed by the most episodes. With --eval-every the evaluator
judges instead (whole episodes of a fresh env, deterministic unless
--no-eval-deterministic, measure the policy itself; see rollout/evaluate.py) and this
object keeps nothing. A resumed run starts from the best its earlier runs kept. It
writes a file and reports; it never changes training.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save as safetensors_bytes

from hetrl.learner.checkpoint import write_atomic
from hetrl.rollout.models import BEST_CHOSEN_BY_TRAINING, BEST_MODEL_FILE, RETURN_WINDOW, best_info

log = logging.getLogger("hetrl.learner")


class BestPolicy:
    """The best weights by training return, and where they go."""

    def __init__(self, out: Path, enabled: bool) -> None:
        self.path = out / BEST_MODEL_FILE
        self.enabled = enabled
        self.mean_return: float | None = None
        self.global_step = 0
        self.version = 0
        self._state: dict[str, torch.Tensor] | None = None
        self._written = True
        previous = best_info(self.path) if enabled else None
        if previous is not None and previous["chosen_by"] == BEST_CHOSEN_BY_TRAINING:
            self.mean_return = previous["mean_return"]  # the bar a resumed run must beat
            self.global_step = previous["global_step"]

    def offer(self, state: dict[str, torch.Tensor], returns: Sequence[float],
              global_step: int, version: int) -> None:
        """After an update: keep `state` (weights nobody modifies) if the mean of the
        last RETURN_WINDOW training `returns` beats the best so far."""
        if not self.enabled or len(returns) < RETURN_WINDOW:
            return
        mean = float(np.mean(list(returns)[-RETURN_WINDOW:]))
        if self.mean_return is not None and mean <= self.mean_return:
            return
        self.mean_return, self.global_step, self.version = mean, global_step, version
        self._state, self._written = state, False

    def write(self, metadata: dict[str, str]) -> Path | None:
        """Write the best weights kept since the last write (None if there are none new).

        Raises:
            OutputError: the file could not be written (the previous one is untouched).
        """
        if self._written or self._state is None:
            return None
        arrays = {k: v.detach().cpu().numpy().copy() for k, v in self._state.items()}
        data = safetensors_bytes(arrays, metadata={
            **metadata,
            "policy_version": str(self.version),
            "global_step": str(self.global_step),
            "best_mean_return": repr(self.mean_return),
            "best_chosen_by": BEST_CHOSEN_BY_TRAINING,
        })
        write_atomic(self.path, data)
        self._written = True
        return self.path

    def summary(self) -> dict | None:
        """The best as the run summary records it: the file's, whoever chose it."""
        return best_info(self.path)

