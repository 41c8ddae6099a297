"""Tests of learner.vtrace.vtrace against a slow loop that reads like the IMPALA paper.

The reference walks each env column and each start step with plain Python loops:
vs_s = V(x_s) + sum_{t=s}^{end} gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t, the sum
stopping after the first terminated or truncated step. Random fragments mimic
gymnasium's NEXT_STEP autoreset: the step after every episode end has valid = 0.
Also checked: on-policy V-trace is GAE(lambda), terminated steps never look at the
next value, truncated steps bootstrap from it, and invalid steps never leak backwards.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrl.learner.vtrace import vtrace

DTYPE = torch.float64


def reference_column(log_rho, r, v, term, trunc, valid, gamma, lam, rho_clip, c_clip):
    """The IMPALA definition for one env column (plain lists; v has T + 1 entries)."""
    T = len(r)
    rho = [min(rho_clip, math.exp(x)) for x in log_rho]
    c = [lam * min(c_clip, math.exp(x)) for x in log_rho]
    delta = [rho[t] * (r[t] + gamma * (0.0 if term[t] else v[t + 1]) - v[t]) for t in range(T)]
    vs = []
    for s in range(T):
        if not valid[s]:
            vs.append(v[s])
            continue
        total = 0.0
        for t in range(s, T):
            trace = 1.0
            for i in range(s, t):
                trace *= c[i]
            total += gamma ** (t - s) * trace * delta[t]
            if term[t] or trunc[t]:
                break
        vs.append(v[s] + total)
    vs_next = vs[1:] + [v[T]]  # vs_T = V(x_T)
    adv = [
        r[t] + gamma * (0.0 if term[t] else vs_next[t]) - v[t] if valid[t] else 0.0
        for t in range(T)
    ]
    return vs, adv


def reference_vtrace(log_rhos, rewards, values, terminated, truncated, valid, **hyper):
    """reference_column on every column, stacked back into [T, B] tensors."""
    columns = [
        reference_column(
            *(x[:, b].tolist() for x in (log_rhos, rewards, values, terminated, truncated, valid)),
            **hyper,
        )
        for b in range(rewards.shape[1])
    ]
    vs = torch.tensor([col[0] for col in columns], dtype=DTYPE)
    adv = torch.tensor([col[1] for col in columns], dtype=DTYPE)
    return vs.T, adv.T


def classic_gae(rewards, values, terminated, truncated, valid, gamma, lam):
    """GAE(lambda) by the usual backward loop; invalid steps get 0 and cut the trace."""
    T, B = rewards.shape
    adv = torch.zeros(T, B, dtype=DTYPE)
    for b in range(B):
        last = 0.0
        for t in reversed(range(T)):
            if not valid[t, b]:
                last = 0.0
                continue
            not_term = 0.0 if terminated[t, b] else 1.0
            not_done = 0.0 if (terminated[t, b] or truncated[t, b]) else 1.0
            delta = rewards[t, b] + gamma * not_term * values[t + 1, b] - values[t, b]
            last = delta.item() + gamma * lam * not_done * last
            adv[t, b] = last
    return adv


def random_fragment(seed, T, B, p_end=0.3, off_policy=True, reset_steps=True):
    """Random [T, B] inputs; the step after each episode end is an invalid reset step
    (unless reset_steps=False: then episodes follow each other directly, SAME_STEP style)."""
    g = torch.Generator().manual_seed(seed)
    terminated = torch.zeros(T, B, dtype=torch.bool)
    truncated = torch.zeros(T, B, dtype=torch.bool)
    valid = torch.ones(T, B, dtype=torch.bool)
    for b in range(B):
        after_end = torch.rand((), generator=g).item() < p_end  # previous fragment ended
        for t in range(T):
            if after_end:
                valid[t, b], after_end = False, False
            elif torch.rand((), generator=g).item() < p_end:
                if torch.rand((), generator=g).item() < 0.5:
                    terminated[t, b] = True
                else:
                    truncated[t, b] = True
                after_end = reset_steps
    scale = 1.0 if off_policy else 0.0
    return dict(
        log_rhos=scale * torch.randn(T, B, generator=g, dtype=DTYPE),
        rewards=torch.randn(T, B, generator=g, dtype=DTYPE),
        values=torch.randn(T + 1, B, generator=g, dtype=DTYPE),
        terminated=terminated,
        truncated=truncated,
        valid=valid,
    )


def check_against_reference(inputs, **hyper):
    vs, adv = vtrace(**inputs, **hyper)
    ref_vs, ref_adv = reference_vtrace(**inputs, **hyper)
    torch.testing.assert_close(vs, ref_vs)
    torch.testing.assert_close(adv, ref_adv)


HYPER = [
    dict(gamma=0.99, lam=1.0, rho_clip=1.0, c_clip=1.0),
    dict(gamma=0.9, lam=0.95, rho_clip=1.0, c_clip=1.0),
    dict(gamma=0.5, lam=0.7, rho_clip=2.0, c_clip=0.5),
    dict(gamma=1.0, lam=0.0, rho_clip=0.8, c_clip=3.0),
]


@pytest.mark.parametrize("hyper", HYPER)
@pytest.mark.parametrize("off_policy", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_matches_reference(seed, off_policy, hyper):
    g = torch.Generator().manual_seed(1000 + seed)
    T, B = int(torch.randint(1, 21, (), generator=g)), int(torch.randint(1, 7, (), generator=g))
    check_against_reference(random_fragment(seed, T, B, off_policy=off_policy), **hyper)


@pytest.mark.parametrize("seed", range(5))
def test_episode_ends_cut_the_trace_without_reset_steps(seed):
    """Done steps alone stop the sum, even when no invalid step follows them."""
    inputs = random_fragment(seed, T=15, B=4, p_end=0.4, reset_steps=False)
    check_against_reference(inputs, **HYPER[2])


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    T=st.integers(1, 20),
    B=st.integers(1, 6),
    p_end=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    rho_clip=st.floats(0.1, 5.0),
    c_clip=st.floats(0.1, 5.0),
)
def test_matches_reference_property(seed, T, B, p_end, gamma, lam, rho_clip, c_clip):
    check_against_reference(
        random_fragment(seed, T, B, p_end=p_end),
        gamma=gamma,
        lam=lam,
        rho_clip=rho_clip,
        c_clip=c_clip,
    )


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("seed", range(5))
def test_on_policy_is_gae(seed, lam):
    inputs = random_fragment(seed, T=17, B=5, off_policy=False)
    vs, adv = vtrace(**inputs, gamma=0.97, lam=lam, rho_clip=1.0, c_clip=1.0)
    gae = classic_gae(
        inputs["rewards"],
        inputs["values"],
        inputs["terminated"],
        inputs["truncated"],
        inputs["valid"],
        gamma=0.97,
        lam=lam,
    )
    torch.testing.assert_close(vs - inputs["values"][:-1], gae)
    if lam == 1.0:  # the one-step PG target then equals the lambda-return advantage
        torch.testing.assert_close(adv, gae)


def _one_episode_end(kind):
    """One column, T=4: step 1 ends the episode, step 2 is the reset step."""
    inputs = random_fragment(0, T=4, B=1, p_end=0.0)
    inputs[kind][1, 0] = True
    inputs["valid"][2, 0] = False
    return inputs


HYPER_OFF = dict(gamma=0.9, lam=0.8, rho_clip=1.5, c_clip=1.2)


def test_terminated_step_ignores_next_value():
    inputs = _one_episode_end("terminated")
    vs, adv = vtrace(**inputs, **HYPER_OFF)
    inputs["values"][2, 0] += 1e3  # V of the final observation of a terminated episode
    vs2, adv2 = vtrace(**inputs, **HYPER_OFF)
    torch.testing.assert_close(vs[:2], vs2[:2])
    torch.testing.assert_close(adv[:2], adv2[:2])
    rho = min(1.5, math.exp(inputs["log_rhos"][1, 0].item()))
    r, v = inputs["rewards"][1, 0], inputs["values"][1, 0]
    torch.testing.assert_close(vs[1, 0], v + rho * (r - v))
    torch.testing.assert_close(adv[1, 0], r - v)


def test_truncated_step_bootstraps_from_next_value():
    inputs = _one_episode_end("truncated")
    vs, adv = vtrace(**inputs, **HYPER_OFF)
    rho = min(1.5, math.exp(inputs["log_rhos"][1, 0].item()))
    r, v, v_next = inputs["rewards"][1, 0], inputs["values"][1, 0], inputs["values"][2, 0]
    torch.testing.assert_close(vs[1, 0], v + rho * (r + 0.9 * v_next - v))
    torch.testing.assert_close(adv[1, 0], r + 0.9 * v_next - v)
    inputs["values"][2, 0] += 1.0
    vs2, adv2 = vtrace(**inputs, **HYPER_OFF)
    torch.testing.assert_close(vs2[1, 0] - vs[1, 0], rho * 0.9 * torch.ones((), dtype=DTYPE))
    torch.testing.assert_close(adv2[1, 0] - adv[1, 0], 0.9 * torch.ones((), dtype=DTYPE))


@pytest.mark.parametrize("kind", ["terminated", "truncated"])
def test_invalid_steps_do_not_leak_backwards(kind):
    inputs = _one_episode_end(kind)
    vs, adv = vtrace(**inputs, **HYPER_OFF)
    # Garbage on the reset step and beyond must not reach steps 0 and 1.
    inputs["rewards"][2:, 0] = 1e6
    inputs["log_rhos"][2:, 0] = 50.0
    inputs["values"][3:, 0] = -1e6
    vs2, adv2 = vtrace(**inputs, **HYPER_OFF)
    torch.testing.assert_close(vs2[:2], vs[:2])
    torch.testing.assert_close(adv2[:2], adv[:2])
    # The reset step itself: target is its own value, advantage zero.
    torch.testing.assert_close(vs2[2, 0], inputs["values"][2, 0])
    assert adv2[2, 0].item() == 0.0


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95])
@pytest.mark.parametrize("seed", range(5))
def test_gae_advantages_on_policy_are_classic_gae(seed, lam):
    """--advantages gae: vs - V, which on-policy is the usual GAE(lambda) loop's."""
    from hetrl.learner.ppo import gae_advantages

    inputs = random_fragment(seed, T=17, B=5, off_policy=False)
    vs, _ = vtrace(**inputs, gamma=0.97, lam=lam, rho_clip=1.0, c_clip=1.0)
    expected = classic_gae(inputs["rewards"], inputs["values"], inputs["terminated"],
                           inputs["truncated"], inputs["valid"], gamma=0.97, lam=lam)
    torch.testing.assert_close(gae_advantages(vs, inputs["values"], inputs["valid"]), expected)


@pytest.mark.parametrize("rho_clip", [1.0, 0.7])
@pytest.mark.parametrize("lam", [0.0, 0.95])
@pytest.mark.parametrize("seed", range(4))
def test_own_action_gae_is_vtraces_vs_minus_v_without_the_steps_weight(seed, lam, rho_clip):
    """--clip-against learner's advantage: vs - V is min(rho-bar, rho_t) times it when
    rho-bar = c-bar (so the loss can weight each step once), and on-policy it is GAE."""
    from hetrl.learner.vtrace import own_action_gae

    hyper = dict(gamma=0.97, lam=lam, rho_clip=rho_clip, c_clip=rho_clip)
    inputs = random_fragment(seed, T=17, B=5, reset_steps=seed % 2 == 0)
    vs, _ = vtrace(**inputs, **hyper)
    own = own_action_gae(vs, inputs["rewards"], inputs["values"], inputs["terminated"],
                         inputs["truncated"], inputs["valid"], gamma=0.97, lam=lam)
    weight = inputs["log_rhos"].exp().clamp(max=rho_clip) * inputs["valid"]
    torch.testing.assert_close(vs - inputs["values"][:-1], weight * own)
    assert not torch.allclose(own * inputs["valid"], (vs - inputs["values"][:-1])), \
        "off-policy, the weight should matter"

    on_policy = random_fragment(seed, T=17, B=5, off_policy=False)
    vs, _ = vtrace(**on_policy, gamma=0.97, lam=lam, rho_clip=1.0, c_clip=1.0)
    expected = classic_gae(on_policy["rewards"], on_policy["values"], on_policy["terminated"],
                           on_policy["truncated"], on_policy["valid"], gamma=0.97, lam=lam)
    torch.testing.assert_close(own_action_gae(
        vs, on_policy["rewards"], on_policy["values"], on_policy["terminated"],
        on_policy["truncated"], on_policy["valid"], gamma=0.97, lam=lam), expected)
