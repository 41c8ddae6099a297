"""The best policy by training return: kept from a full window of episodes on, replaced
only by a better mean, written as a model `load_policy` reads, and carried across a
resume."""

from __future__ import annotations

from pathlib import Path

import torch

from hetrl.launch.settings import LocalSettings
from hetrl.learner.best import BestPolicy
from hetrl.rollout.envs import describe_env
from hetrl.rollout.evaluate import load_policy, model_metadata
from hetrl.rollout.models import RETURN_WINDOW, best_info
from hetrl.rollout.policy import Policy


def _state(fill: float) -> dict[str, torch.Tensor]:
    settings = LocalSettings()
    spaces = describe_env(settings)
    policy = Policy(spaces.observation_space, spaces.action_space, settings)
    with torch.no_grad():
        for p in policy.parameters():
            p.fill_(fill)
    return {k: v.clone() for k, v in policy.state_dict().items()}


def test_kept_from_a_full_window_on_and_only_for_a_better_mean(tmp_path: Path) -> None:
    best = BestPolicy(tmp_path, enabled=True)
    best.offer(_state(1.0), [500.0] * (RETURN_WINDOW - 1), 1000, 1)
    assert best.write({}) is None  # 99 episodes: not yet judged
    best.offer(_state(2.0), [100.0] * RETURN_WINDOW, 2000, 2)
    best.offer(_state(3.0), [100.0] * RETURN_WINDOW, 3000, 3)  # a tie keeps the earlier
    best.offer(_state(4.0), [50.0] * RETURN_WINDOW, 4000, 4)
    metadata = model_metadata(LocalSettings())
    assert best.write(metadata) == tmp_path / "model-best.safetensors"
    assert best.write(metadata) is None  # nothing new since
    info = best_info(tmp_path / "model-best.safetensors")
    assert info is not None
    assert (info["global_step"], info["mean_return"], info["chosen_by"]) == (
        2000, 100.0, "training return")
    trained = load_policy(tmp_path, "best")
    assert all(float(p.detach().flatten()[0]) == 2.0 for p in trained.policy.parameters())
    # The last RETURN_WINDOW returns count, however many the caller holds.
    best.offer(_state(5.0), [0.0] * 50 + [150.0] * RETURN_WINDOW, 5000, 5)
    assert best.write(metadata) is not None and best.global_step == 5000


def test_a_resumed_run_must_beat_the_best_of_the_runs_before(tmp_path: Path) -> None:
    first = BestPolicy(tmp_path, enabled=True)
    first.offer(_state(1.0), [300.0] * RETURN_WINDOW, 1000, 1)
    first.write(model_metadata(LocalSettings()))
    resumed = BestPolicy(tmp_path, enabled=True)
    resumed.offer(_state(2.0), [250.0] * RETURN_WINDOW, 2000, 2)
    assert resumed.write({}) is None
    assert best_info(tmp_path / "model-best.safetensors")["global_step"] == 1000


def test_with_evaluations_the_learner_keeps_nothing(tmp_path: Path) -> None:
    best = BestPolicy(tmp_path, enabled=False)
    best.offer(_state(1.0), [300.0] * RETURN_WINDOW, 1000, 1)
    assert best.write({}) is None and not (tmp_path / "model-best.safetensors").exists()
