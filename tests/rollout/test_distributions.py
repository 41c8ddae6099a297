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


def test_multi_categorical_is_the_sum_of_its_choices_categoricals():
    from hetrl.rollout.distributions import MultiCategorical

    gen = torch.Generator().manual_seed(5)
    nvec = (3, 2, 4)
    logits = torch.randn(32, sum(nvec), generator=gen, requires_grad=True)
    actions = torch.stack([torch.randint(n, (32,), generator=gen) for n in nvec], -1)
    ours = MultiCategorical(logits, nvec)
    blocks = logits.split(list(nvec), -1)
    theirs = [TorchCategorical(logits=b) for b in blocks]
    ref_logp = sum(d.log_prob(actions[:, i]) for i, d in enumerate(theirs))
    torch.testing.assert_close(ours.log_prob(actions), ref_logp)
    torch.testing.assert_close(ours.entropy(), sum(d.entropy() for d in theirs))
    assert ours.log_prob(actions).shape == ours.entropy().shape == (32,)
    assert torch.equal(ours.mode(), torch.stack([b.argmax(-1) for b in blocks], -1))
    sampled = ours.sample()
    assert sampled.shape == (32, 3) and not sampled.requires_grad
    assert all(int(sampled[:, i].max()) < n and int(sampled[:, i].min()) >= 0
               for i, n in enumerate(nvec))
    grad = torch.autograd.grad(ours.log_prob(actions).sum() + ours.entropy().sum(), logits)[0]
    ref = torch.autograd.grad(ref_logp.sum() + sum(d.entropy() for d in theirs).sum(), logits)[0]
    torch.testing.assert_close(grad, ref)


def test_bernoulli_matches_torch_summed_over_bits():
    from torch.distributions import Bernoulli as TorchBernoulli

    from hetrl.rollout.distributions import Bernoulli

    gen = torch.Generator().manual_seed(9)
    logits = (3 * torch.randn(32, 5, generator=gen)).requires_grad_()
    actions = torch.randint(2, (32, 5), generator=gen)
    ours, theirs = Bernoulli(logits), TorchBernoulli(logits=logits)
    ref_logp = theirs.log_prob(actions.float()).sum(-1)
    torch.testing.assert_close(ours.log_prob(actions), ref_logp)
    torch.testing.assert_close(ours.entropy(), theirs.entropy().sum(-1))
    assert torch.equal(ours.mode(), (logits > 0).long())
    grad = torch.autograd.grad(ours.log_prob(actions).sum() + ours.entropy().sum(), logits)[0]
    ref = torch.autograd.grad(ref_logp.sum() + theirs.entropy().sum(), logits)[0]
    torch.testing.assert_close(grad, ref)
    torch.manual_seed(2)
    sampled = ours.sample()
    assert sampled.dtype == torch.int64 and set(sampled.unique().tolist()) <= {0, 1}
    # sampling follows the probabilities: mean of many samples near sigmoid(logit)
    many = Bernoulli(torch.tensor([[-2.0, 0.0, 2.0]]).expand(20_000, 3)).sample().float()
    torch.testing.assert_close(many.mean(0), torch.sigmoid(torch.tensor([-2.0, 0.0, 2.0])),
                               atol=0.02, rtol=0)
