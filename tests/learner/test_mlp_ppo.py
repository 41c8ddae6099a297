"""learner.mlp_ppo: the built-in MLP's hand-derived numpy gradients are autograd's, step
by step, for every head, activation and shape it takes; anything else trains through
autograd."""

from __future__ import annotations

import copy
import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from hetrl.learner.mlp_ppo import MLPMinibatchSteps
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.ppo import ppo_update
from hetrl.learner.settings import TrainSettings
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import PolicySettings
from tests.learner.test_ppo import SPACES, random_batch

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
# 24 valid-or-not steps in minibatches of 24 // 5: the last minibatch is a short one.
CFG = TrainSettings(epochs=2, minibatches=5, ent_coef=0.0, gamma=0.9, gae_lambda=0.8)


class RecordingAdam(PolicyAdam):
    """PolicyAdam that keeps a copy of every gradient it steps with."""

    def __init__(self, policy: nn.Module, learning_rate: float) -> None:
        super().__init__(policy, learning_rate)
        self.seen: list[torch.Tensor] = []

    def step(self, closure=None):  # type: ignore[override]
        assert self.flat is not None and self.flat.buffer.grad is not None
        self.seen.append(self.flat.buffer.grad.clone())
        return super().step(closure)


def make_policy(kind: str, seed: int, **settings) -> Policy:
    torch.manual_seed(seed)
    return Policy(OBS, SPACES[kind], PolicySettings(**settings))


def train_both(policy: Policy, cfg: TrainSettings, seed: int, updates: int = 2):
    """The same updates through the numpy steps and through autograd, from the same
    weights and random stream: (policy, optimizer, stats) for each side."""
    sides = []
    for gradients in ("auto", "autograd"):
        mine = copy.deepcopy(policy)
        optimizer = RecordingAdam(mine, 1e-2)
        side_cfg = dataclasses.replace(cfg, gradients=gradients)
        taken = MLPMinibatchSteps.for_policy(mine, optimizer, side_cfg) is not None
        assert taken == (gradients == "auto"), "the numpy steps should apply to this policy"
        torch.manual_seed(seed)
        stats = [ppo_update(mine, optimizer, random_batch(mine, seed + u), side_cfg)
                 for u in range(updates)]
        sides.append((mine, optimizer, stats))
    return sides


def assert_same_training(numpy_side, autograd_side) -> None:
    (mine, my_opt, my_stats), (theirs, their_opt, their_stats) = numpy_side, autograd_side
    assert len(my_opt.seen) == len(their_opt.seen) > 0
    for step, (a, b) in enumerate(zip(my_opt.seen, their_opt.seen, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"gradient of step {step}")
    for (name, a), b in zip(mine.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    for mine_stats, their_stats_one in zip(my_stats, their_stats, strict=True):
        assert mine_stats.keys() == their_stats_one.keys()
        for key, value in their_stats_one.items():
            assert mine_stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("kind", SPACES)
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize(("ent_coef", "clip_against"),
                         [(0.0, "behaviour"), (0.05, "behaviour"), (0.0, "learner")])
def test_numpy_gradients_are_autograds_step_by_step(kind: str, activation: str,
                                                    ent_coef: float, clip_against: str) -> None:
    policy = make_policy(kind, 0, activation=activation, hidden_sizes=(16, 8))
    cfg = dataclasses.replace(CFG, ent_coef=ent_coef, clip_against=clip_against)
    numpy_side, autograd_side = train_both(policy, cfg, seed=4)
    assert_same_training(numpy_side, autograd_side)
    assert any(not torch.equal(a, b) for a, b in zip(numpy_side[0].parameters(),
                                                     policy.parameters(), strict=True))
    clipfrac = numpy_side[2][-1]["losses/clipfrac"]
    if clip_against == "behaviour":
        assert 0 < clipfrac < 1, "the batch should clip some ratios and not others"
    else:  # ratios start at 1 from the learner's own policy; the weights are what differs
        assert clipfrac < 1


@pytest.mark.parametrize("kind", SPACES)
@pytest.mark.parametrize("value_clip", [0.02, 0.3])  # binds on most steps, on some
def test_numpy_gradients_hold_under_a_clipped_value_loss(kind: str, value_clip: float) -> None:
    policy = make_policy(kind, 3, hidden_sizes=(16, 8))
    clipped = dataclasses.replace(CFG, value_clip=value_clip)
    numpy_side, autograd_side = train_both(policy, clipped, seed=5, updates=3)
    assert_same_training(numpy_side, autograd_side)
    # The clip changed the training: without it the same updates end elsewhere.
    unclipped, _ = train_both(policy, CFG, seed=5, updates=3)
    assert any(not torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(
        numpy_side[0].parameters(), unclipped[0].parameters(), strict=True))


@pytest.mark.parametrize("hidden", [(32,), (64, 64, 16)])  # () is refused: no linear policy
@pytest.mark.parametrize("minibatches", [1, 7, 30])  # 30 > 24 steps: minibatches of one
def test_numpy_gradients_hold_for_any_depth_and_minibatch_size(hidden: tuple[int, ...],
                                                               minibatches: int) -> None:
    policy = make_policy("continuous", 1, hidden_sizes=hidden, normalize_observations=True)
    cfg = dataclasses.replace(CFG, minibatches=minibatches, advantages="gae")
    assert_same_training(*train_both(policy, cfg, seed=7))


def test_a_seeded_run_draws_the_same_minibatches_either_way() -> None:
    # Same minibatches, so the same gradients: checked above; here, that after the
    # update both sides left torch's random stream at the same place.
    policy = make_policy("discrete", 2)
    after = []
    for gradients in ("auto", "autograd"):
        mine = copy.deepcopy(policy)
        torch.manual_seed(9)
        ppo_update(mine, PolicyAdam(mine, 1e-3), random_batch(mine, 9),
                   dataclasses.replace(CFG, gradients=gradients))
        after.append(torch.rand(3))
    torch.testing.assert_close(after[0], after[1])


class Custom(nn.Module):
    def __init__(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        self.body = nn.Linear(4, 3)
        self.value = nn.Linear(4, 1)

    def forward(self, obs: torch.Tensor):
        return self.body(obs), self.value(obs).squeeze(-1)


def test_what_the_numpy_steps_cannot_train_goes_through_autograd() -> None:
    def applies(policy: Policy, optimizer=None, cfg: TrainSettings = CFG) -> bool:
        optimizer = optimizer if optimizer is not None else PolicyAdam(policy, 1e-3)
        return MLPMinibatchSteps.for_policy(policy, optimizer, cfg) is not None

    assert applies(make_policy("discrete", 0))
    assert applies(make_policy("continuous", 0))
    assert not applies(make_policy("discrete", 0), cfg=dataclasses.replace(
        CFG, gradients="autograd"))
    plain = make_policy("discrete", 0)
    assert not applies(plain, torch.optim.Adam(plain.parameters(), lr=1e-3))
    assert not applies(make_policy("discrete", 0).double())  # float64 weights
    custom = Policy(OBS, SPACES["discrete"], PolicySettings(
        policy=f"{__name__}:Custom"))
    assert not applies(custom)
    extra = make_policy("discrete", 0)
    extra.temperature = nn.Parameter(torch.ones(()))  # trained, but not by these steps
    assert not applies(extra)
    mixed = make_policy("continuous", 0)
    mixed.net.actor[1] = nn.ELU()  # an activation they do not derive
    assert not applies(mixed)
    # A custom policy still trains (through autograd).
    stats = ppo_update(custom, PolicyAdam(custom, 1e-3), random_batch(custom, 0), CFG)
    assert np.isfinite(stats["losses/policy_loss"])
