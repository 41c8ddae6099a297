"""learner.optimizer.PolicyAdam: the policy's parameters in one flat buffer, stepped as
textbook Adam steps them tensor by tensor, with the flat layout guarded and old
(tensor-by-tensor) optimizer checkpoints still loading."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.ppo import ppo_update
from hetrl.learner.settings import TrainSettings
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import PolicySettings
from tests.learner.test_ppo import SPACES, random_batch

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
CFG = TrainSettings(epochs=2, minibatches=3)


def continuous_policy(seed: int = 3) -> Policy:
    torch.manual_seed(seed)
    return Policy(OBS, SPACES["continuous"], PolicySettings(normalize_observations=False))


def train(policy: Policy, optimizer: torch.optim.Optimizer, seeds: range) -> None:
    for seed in seeds:
        torch.manual_seed(seed)  # the same batch and minibatch order on every side
        ppo_update(policy, optimizer, random_batch(policy, seed), CFG)


def assert_same_parameters(mine: nn.Module, theirs: nn.Module) -> None:
    for (name, a), b in zip(mine.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_flat_adam_steps_as_textbook_adam_and_keeps_the_parameter_names() -> None:
    policy = continuous_policy()
    reference, start = copy.deepcopy(policy), copy.deepcopy(policy)
    names = list(policy.state_dict())
    optimizer = PolicyAdam(policy, 3e-4)
    assert optimizer.flat is not None and len(optimizer.param_groups[0]["params"]) == 1
    textbook = torch.optim.Adam(reference.parameters(), lr=3e-4, eps=1e-5, foreach=False)
    train(policy, optimizer, range(3))
    train(reference, textbook, range(3))
    assert_same_parameters(policy, reference)
    assert any(not torch.equal(a, b) for a, b in zip(policy.parameters(), start.parameters(),
                                                     strict=True)), "nothing trained"
    assert list(policy.state_dict()) == names
    flat = optimizer.flat.buffer
    for p in policy.parameters():  # still views of the one buffer, data and gradient
        assert flat.data_ptr() <= p.data_ptr() < flat.data_ptr() + flat.nbytes
        assert p.grad is not None and p.grad.untyped_storage().data_ptr() == \
            flat.grad.untyped_storage().data_ptr()


def test_loading_weights_keeps_them_in_the_flat_buffer() -> None:
    """The learner loads weights in place (resume, rollback after a non-finite update):
    the optimizer must go on stepping the parameters the policy uses."""
    policy, other = continuous_policy(3), continuous_policy(4)
    optimizer = PolicyAdam(policy, 3e-4)
    policy.load_state_dict(other.state_dict())
    optimizer.check()
    assert_same_parameters(policy, other)
    train(policy, optimizer, range(1))
    assert any(not torch.equal(a, b) for a, b in zip(policy.parameters(), other.parameters(),
                                                     strict=True))


@pytest.mark.parametrize("breaks", ["module zero_grad", "moved parameters"])
def test_an_update_refuses_a_policy_that_left_the_flat_buffer(breaks: str) -> None:
    policy = continuous_policy()
    optimizer = PolicyAdam(policy, 3e-4)
    if breaks == "module zero_grad":
        policy.zero_grad()  # sets the gradients to None: backward would make new ones
    else:
        policy.to(torch.float64).to(torch.float32)  # .to() gives new tensors
    with pytest.raises(RuntimeError, match="flat buffer"):
        train(policy, optimizer, range(1))


def test_mixed_dtypes_fall_back_to_tensor_by_tensor() -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 2)
            self.b = nn.Linear(3, 2).double()

    net = Mixed()
    optimizer = PolicyAdam(net, 1e-2)
    assert optimizer.flat is None and len(optimizer.param_groups[0]["params"]) == 4
    before = copy.deepcopy(net)
    loss = net.a(torch.ones(1, 3)).sum() + net.b(torch.ones(1, 3, dtype=torch.float64)).sum()
    loss.backward()
    optimizer.step()
    assert all(not torch.equal(p, q) for p, q in zip(net.parameters(), before.parameters(),
                                                     strict=True))


def test_a_tensor_by_tensor_checkpoint_resumes_with_its_moments() -> None:
    """An optimizer state saved before the flat buffer (one entry per parameter) loads
    into PolicyAdam and the run goes on as if it had never stopped."""
    policy = continuous_policy()
    textbook = torch.optim.Adam(policy.parameters(), lr=3e-4, eps=1e-5, foreach=False)
    train(policy, textbook, range(2))
    saved = copy.deepcopy({"policy": policy.state_dict(), "optimizer": textbook.state_dict()})
    train(policy, textbook, range(2, 4))  # the run as it would have gone on

    resumed = continuous_policy(9)
    resumed.load_state_dict(saved["policy"])
    optimizer = PolicyAdam(resumed, 3e-4)
    optimizer.load_state_dict(saved["optimizer"])
    assert len(optimizer.state_dict()["state"]) == 1
    train(resumed, optimizer, range(2, 4))
    assert_same_parameters(resumed, policy)


def test_a_flat_checkpoint_round_trips() -> None:
    policy = continuous_policy()
    optimizer = PolicyAdam(policy, 3e-4)
    train(policy, optimizer, range(2))
    saved = copy.deepcopy({"policy": policy.state_dict(), "optimizer": optimizer.state_dict()})
    train(policy, optimizer, range(2, 4))

    resumed = continuous_policy(9)
    resumed.load_state_dict(saved["policy"])
    again = PolicyAdam(resumed, 3e-4)
    again.load_state_dict(saved["optimizer"])
    train(resumed, again, range(2, 4))
    assert_same_parameters(resumed, policy)
