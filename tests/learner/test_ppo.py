"""Tests of learner.ppo.ppo_update against a slow loop over single samples.

The reference takes one epoch of one minibatch the way the PPO paper reads: V-trace
targets from tests/learner/test_vtrace.py's loop, each valid step's network output
computed on its own, the clipped surrogate, value and entropy terms per sample,
averaged, then one gradient step (SGD here, so parameters compare exactly). Random
batches have episode ends, each followed by an invalid reset step, and behaviour
log-probs off the current policy, so some ratios are clipped.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from hetrl.learner.ppo import Batch, ppo_update, value_error
from hetrl.learner.settings import TrainSettings
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import PolicySettings
from tests.learner.test_vtrace import random_fragment, reference_vtrace

T, N = 6, 4
CFG = TrainSettings(epochs=1, minibatches=1, clip_coef=0.2, ent_coef=0.01, vf_coef=0.5,
                    advantages="vtrace",
                    max_grad_norm=0.5, gamma=0.9, gae_lambda=0.8, vtrace_rho_clip=1.0,
                    vtrace_c_clip=1.0, reward_scale=0.5)
SPACES = {
    "discrete": gym.spaces.Discrete(3),
    "continuous": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
}


def random_batch(policy: Policy, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    obs = torch.from_numpy(rng.standard_normal((T + 1, N, 4)).astype(np.float32))
    with torch.no_grad():
        dist, _ = policy(obs[:-1].reshape(T * N, 4))
        actions = dist.sample()
        logp = dist.log_prob(actions).reshape(T, N)
    # Episode ends, each followed by an invalid reset step, as a collector makes them.
    steps = random_fragment(seed, T, N)
    return Batch(
        observations=obs,
        actions=actions.reshape(T, N, *actions.shape[1:]),
        rewards=steps["rewards"].float(),
        terminated=steps["terminated"],
        truncated=steps["truncated"],
        valid=steps["valid"],
        # Off the current policy, so that ratios spread around 1 and some are clipped.
        logprobs=logp + torch.from_numpy(rng.normal(0, 0.3, (T, N)).astype(np.float32)),
    )


def reference_update(policy: Policy, optimizer, batch: Batch, cfg: TrainSettings) -> dict:
    """One epoch, one minibatch of every valid step, one sample at a time."""
    def one(t: int, i: int):
        dist, value = policy(batch.observations[t, i][None])
        return dist, value[0]

    with torch.no_grad():
        values = torch.tensor([[one(t, i)[1].item() for i in range(N)] for t in range(T + 1)],
                              dtype=torch.float64)
        target_logp = torch.tensor(
            [[one(t, i)[0].log_prob(batch.actions[t, i][None]).item()
              for i in range(N)] for t in range(T)], dtype=torch.float64)
    vs, adv = reference_vtrace(
        target_logp - batch.logprobs.double(), batch.rewards.double() * cfg.reward_scale,
        values, batch.terminated, batch.truncated, batch.valid, gamma=cfg.gamma,
        lam=cfg.gae_lambda, rho_clip=cfg.vtrace_rho_clip, c_clip=cfg.vtrace_c_clip)
    steps = [(t, i) for t in range(T) for i in range(N) if batch.valid[t, i]]
    if cfg.advantages == "gae" and cfg.clip_against == "learner":
        # the step's own GAE over the corrected tail: the loss weights the step itself
        def own(t: int, i: int) -> float:
            ended = bool(batch.terminated[t, i] or batch.truncated[t, i])
            delta = (batch.rewards[t, i].item() * cfg.reward_scale - values[t, i].item()
                     + cfg.gamma * (not batch.terminated[t, i]) * values[t + 1, i].item())
            tail = 0.0 if ended or t + 1 == T else vs[t + 1, i].item() - values[t + 1, i].item()
            return delta + cfg.gamma * cfg.gae_lambda * tail
        raw = [own(t, i) for t, i in steps]
    elif cfg.advantages == "gae":
        raw = [vs[t, i].item() - values[t, i].item() for t, i in steps]
    else:
        raw = [adv[t, i].item() for t, i in steps]
    mean, std = statistics.fmean(raw), statistics.stdev(raw)
    pg, vf, ent, kl, clipped = [], [], [], [], 0
    for (t, i), a in zip(steps, raw, strict=True):
        a = (a - mean) / (std + 1e-8)
        dist, value = one(t, i)
        if cfg.clip_against == "learner":  # decoupled PPO: the learner's policy anchors
            anchor = target_logp[t, i].float()
            a *= min(cfg.vtrace_rho_clip, math.exp(target_logp[t, i].item()
                                                   - batch.logprobs[t, i].item()))
        else:
            anchor = batch.logprobs[t, i]
        logratio = dist.log_prob(batch.actions[t, i][None])[0] - anchor
        ratio = logratio.exp()
        clamped = ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)
        pg.append(torch.max(-a * ratio, -a * clamped))
        vf.append(0.5 * (value - vs[t, i].item()) ** 2)
        ent.append(dist.entropy()[0])
        kl.append(((ratio - 1) - logratio).item())
        clipped += abs(ratio.item() - 1) > cfg.clip_coef
    pg_loss, v_loss, entropy = (torch.stack(x).mean() for x in (pg, vf, ent))
    optimizer.zero_grad()
    (pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss).backward()
    actor_names = ("net.actor.", "log_std")
    actor_square = sum(p.grad.square().sum().item() for name, p in policy.named_parameters()
                       if name.startswith(actor_names))
    grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm).item()
    optimizer.step()
    old = np.array([values[t, i].item() for t, i in steps])
    returns = np.array([vs[t, i].item() for t, i in steps])
    weights = {}
    if cfg.clip_against == "learner":
        weights["losses/lag_weight_mean"] = statistics.fmean(
            min(cfg.vtrace_rho_clip, math.exp(target_logp[t, i].item()
                                              - batch.logprobs[t, i].item())) for t, i in steps)
    return weights | {
        "losses/policy_loss": pg_loss.item(),
        "losses/value_loss": v_loss.item(),
        "losses/entropy": entropy.item(),
        "losses/approx_kl": statistics.fmean(kl),
        "losses/clipfrac": clipped / len(steps),
        "losses/explained_variance": 1 - np.var(returns - old) / np.var(returns),
        "charts/samples_trained": float(len(steps)),
        "losses/grad_norm": grad_norm,
        "losses/actor_grad_share": actor_square / grad_norm**2,
    }


@pytest.mark.parametrize("kind", SPACES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("ent_coef", "normalize"), [(0.01, False), (0.0, True)])
@pytest.mark.parametrize("clip_against", ["behaviour", "learner"])
@pytest.mark.parametrize("advantages", ["vtrace", "gae"])
def test_ppo_update_matches_the_per_sample_reference(kind: str, seed: int, ent_coef: float,
                                                     normalize: bool, clip_against: str,
                                                     advantages: str) -> None:
    cfg = dataclasses.replace(CFG, ent_coef=ent_coef, clip_against=clip_against,
                              advantages=advantages)
    torch.manual_seed(seed)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    policy = Policy(obs_space, SPACES[kind], PolicySettings(normalize_observations=normalize))
    reference = copy.deepcopy(policy)
    batch = random_batch(policy, seed)
    stats = ppo_update(policy, torch.optim.SGD(policy.parameters(), lr=0.1), batch, cfg)
    if normalize:  # the update first takes the batch's valid observations into its statistics
        reference.obs_rms.update(batch.observations[:-1][batch.valid])
        torch.testing.assert_close(reference.obs_rms.var, policy.obs_rms.var)
    expected = reference_update(reference, torch.optim.SGD(reference.parameters(), lr=0.1),
                                batch, cfg)
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    if clip_against == "behaviour":
        assert 0 < expected["losses/clipfrac"] < 1, "the batch should clip some ratios"
    else:  # one step from the anchor itself: nothing clipped yet
        assert expected["losses/clipfrac"] == 0
    for (name, mine), theirs in zip(policy.named_parameters(), reference.parameters(),
                                    strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6, msg=name)
    assert all(math.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("kind", SPACES)
@pytest.mark.parametrize("advantages", ["vtrace", "gae"])
def test_at_lag_0_both_clip_anchors_train_alike(kind: str, advantages: str) -> None:
    # Behaviour log-probs from the policy itself (lag 0): the learner's anchor is the
    # behaviour's and every weight is 1, so four epochs of minibatches end the same.
    torch.manual_seed(3)
    policy = Policy(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), SPACES[kind],
                    PolicySettings(normalize_observations=False))
    batch = random_batch(policy, 3)
    with torch.no_grad():
        dist, _ = policy(batch.observations[:-1].reshape(T * N, 4))
        batch.logprobs = dist.log_prob(batch.actions.reshape(T * N, *batch.actions.shape[2:])
                                       ).reshape(T, N)
    trained = []
    for clip_against in ("behaviour", "learner"):
        mine = copy.deepcopy(policy)
        torch.manual_seed(5)
        cfg = dataclasses.replace(CFG, epochs=4, minibatches=3, clip_against=clip_against,
                                  advantages=advantages)
        ppo_update(mine, torch.optim.Adam(mine.parameters(), lr=3e-2), batch, cfg)
        trained.append(mine)
    for (name, a), b in zip(trained[0].named_parameters(), trained[1].parameters(),
                            strict=True):
        # to float rounding: under gae the learner's advantages are summed in another order
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(trained[0].parameters(),
                                                     policy.parameters(), strict=True))


def test_the_clipped_value_error_matches_a_per_sample_loop() -> None:
    rng = np.random.default_rng(0)
    new, old, returns = (rng.normal(0, 1, 200) for _ in range(3))
    clip = 0.2
    expected = []
    for v, o, r in zip(new, old, returns, strict=True):
        moved = o + min(max(v - o, -clip), clip)
        expected.append(max((v - r) ** 2, (moved - r) ** 2))
    got = value_error(*(torch.from_numpy(x) for x in (new, returns, old)), clip).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert (got > (new - returns) ** 2).any()  # the clip binds somewhere in this batch
    np.testing.assert_array_equal(
        value_error(*(torch.from_numpy(x) for x in (new, returns, old)), 0.0).numpy(),
        (new - returns) ** 2)


def test_a_clipped_value_loss_moves_the_value_less() -> None:
    # Two epochs: the second starts from values the first moved, so the clip can bind.
    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    moved = {}
    for clip in (0.0, 0.01):
        torch.manual_seed(0)
        policy = Policy(obs_space, SPACES["discrete"], PolicySettings(normalize_observations=False))
        batch = random_batch(policy, 0)
        batch.rewards = batch.rewards * 10  # returns far from the initial values
        with torch.no_grad():
            before = policy(batch.observations.reshape(-1, 4))[1]
        cfg = dataclasses.replace(CFG, epochs=8, value_clip=clip)
        stats = ppo_update(policy, torch.optim.Adam(policy.parameters(), lr=0.01), batch, cfg)
        with torch.no_grad():
            after = policy(batch.observations.reshape(-1, 4))[1]
        moved[clip] = (after - before).abs().mean().item()
        assert all(math.isfinite(v) for v in stats.values())
    assert moved[0.01] < 0.5 * moved[0.0], moved
