"""Where a run keeps its models, and what a best-policy file says of itself.

A run directory holds its final policy (model.safetensors) and, once it has one, the best
policy it saw (model-best.safetensors, kept by the learner by training return or by the
evaluator by evaluation). An emulated job keeps them in its learner host's model folder,
which `run_model_dir` finds. Reading file names and safetensors metadata only: no torch
here, so a launcher can report on models without loading a network.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from safetensors import safe_open

from hetrl.rollout.errors import ConfigError

log = logging.getLogger("hetrl.evaluate")

MODEL_FILE = "model.safetensors"
BEST_MODEL_FILE = "model-best.safetensors"
"""The best policy a run has seen, beside the final one (learner/best.py, or the evaluator)."""
BEST_CHOSEN_BY_TRAINING = "training return"
BEST_CHOSEN_BY_EVALUATION = "evaluation"
WHICH = ("best", "final")
RETURN_WINDOW = 100
"""Training episodes a run's mean return is taken over (its mean(100)); the learner keeps
no best policy, and `hetrl report` judges no run, before this many have ended."""


def best_info(path: Path) -> dict[str, Any] | None:
    """What a best-policy file says of itself (step, mean return, who chose it), or None
    when there is no such file."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = dict(f.metadata() or {})
    except Exception as exc:  # half-written by a process that died: as good as none
        log.warning("cannot read %s (%s); ignoring it", path, exc)
        return None
    if "best_mean_return" not in metadata:
        return None
    return {"path": str(path), "global_step": int(metadata.get("global_step", 0)),
            "mean_return": float(metadata["best_mean_return"]),
            "chosen_by": metadata.get("best_chosen_by", "")}


def run_model_dir(path: Path) -> Path:
    """The folder that holds a run's models: the run directory itself, or, for an
    emulated job's folder, the learner host's model folder inside it."""
    if (path / MODEL_FILE).is_file() or (path / BEST_MODEL_FILE).is_file():
        return path
    found = sorted(path.glob(f"hosts/*/model/{MODEL_FILE}"))
    return found[0].parent if len(found) == 1 else path


def model_file(run: str | Path, which: str = "final") -> Path:
    """The model file of `run` (a run directory, an emulated job's folder, or a model
    file itself): its final policy, or the best one it kept.

    Raises:
        ConfigError: there is no such model there.
    """
    if which not in WHICH:
        raise ConfigError(f"which model: choose {' or '.join(WHICH)}, got {which!r}")
    path = Path(run)
    if path.is_file():
        return path
    if not path.is_dir():
        raise ConfigError(f"{path} does not exist: give a run directory (runs/<name>) or "
                          "a model file")
    folder = run_model_dir(path)
    name = MODEL_FILE if which == "final" else BEST_MODEL_FILE
    model = folder / name
    if model.is_file():
        return model
    if which == "best":
        raise ConfigError(
            f"no {BEST_MODEL_FILE} in {folder}: a run keeps its best policy once "
            f"{RETURN_WINDOW} training episodes have ended (or from its first evaluation "
            "with --eval-every); use the final one (which='final', `hetrl enjoy --which "
            "final`)")
    raise ConfigError(f"no {MODEL_FILE} in {folder}: give a run directory (runs/<name>) "
                      "or the model file itself")
