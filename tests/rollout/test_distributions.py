"""hetrl's action distributions against torch.distributions: the same log-probs,
entropies, gradients and, from the same seed, the same samples."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Categorical as TorchCategorical
from torch.distributions import Normal

from hetrl.rollout.distributions import Categorical, DiagonalGaussian


def test_diagonal_gaussian_matches_torch_normal_summed_over_dimensions():
    gen = torch.Generator().manual_seed(3)
    mean = torch.randn(64, 6, generator=gen, requires_grad=True)
    log_std = (0.5 * torch.randn(6, generator=gen)).requires_grad_()
    actions = torch.randn(64, 6, generator=gen) * 2
    ours = DiagonalGaussian(mean, log_std)
    theirs = Normal(mean, log_std.exp().expand_as(mean))

    logp, ref_logp = ours.log_prob(actions), theirs.log_prob(actions).sum(-1)
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(ours.entropy(), theirs.entropy().sum(-1))
    assert ours.entropy().shape == (64,)
    assert torch.equal(ours.mode(), mean)

    grads = torch.autograd.grad((logp.square().mean() + ours.entropy().mean()), (mean, log_std))
    ref = torch.autograd.grad((ref_logp.square().mean() + theirs.entropy().sum(-1).mean()),
                              (mean, log_std))
    for got, want in zip(grads, ref, strict=True):
        torch.testing.assert_close(got, want)

    torch.manual_seed(7)
    sampled = ours.sample()
    torch.manual_seed(7)
    assert torch.equal(sampled, theirs.sample())
    assert not sampled.requires_grad


@pytest.mark.parametrize("batch_shape", [(32,), (4, 8)])
def test_categorical_matches_torch_categorical(batch_shape):
    gen = torch.Generator().manual_seed(5)
    logits = (3 * torch.randn(*batch_shape, 5, generator=gen)).requires_grad_()
    actions = torch.randint(0, 5, batch_shape, generator=gen)
    ours, theirs = Categorical(logits), TorchCategorical(logits=logits)

    torch.testing.assert_close(ours.log_prob(actions), theirs.log_prob(actions))
    torch.testing.assert_close(ours.entropy(), theirs.entropy())
    assert torch.equal(ours.mode(), logits.argmax(-1))
    grads = torch.autograd.grad(ours.log_prob(actions).sum() + ours.entropy().sum(), logits)
    ref = torch.autograd.grad(theirs.log_prob(actions).sum() + theirs.entropy().sum(), logits)
    torch.testing.assert_close(grads, ref)

    torch.manual_seed(11)
    sampled = ours.sample()
    torch.manual_seed(11)
    assert torch.equal(sampled, theirs.sample())
    assert sampled.shape == batch_shape


def test_categorical_entropy_is_finite_when_an_action_is_impossible():
    logits = torch.tensor([[0.0, float("-inf"), 1.0]])
    assert torch.isfinite(Categorical(logits).entropy()).all()
