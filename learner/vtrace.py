"""V-trace value targets and policy-gradient advantages (Espeholt et al., 2018).

Inputs are time-major [T, B] tensors from fragments, plus values [T+1, B] where the last
row bootstraps. Episode ends cut the trace: a terminated step bootstraps from zero, a
truncated one from the value of its true final observation (the next row). Steps with
`valid = 0` (gymnasium's autoreset steps) contribute nothing and carry the value as
their target, so they never leak across an episode boundary. Pure tensor math.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def vtrace(
    log_rhos: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    valid: torch.Tensor,
    gamma: float,
    lam: float = 1.0,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (vs [T, B], advantages [T, B]).

    Args:
        log_rhos: log pi(a|x) - log mu(a|x) of the learner's policy over the behaviour's.
        rewards, terminated, truncated, valid: per step, [T, B].
        values: V(x_0..x_T) under the learner's policy, [T+1, B].
        gamma: discount; lam: trace lambda (on-policy, vs - V is then GAE(lam)).
        rho_clip, c_clip: the clips rho-bar and c-bar.

    The advantage of step t is r_t + gamma * (1 - terminated_t) * vs_{t+1} - V(x_t),
    IMPALA's policy-gradient target; the caller's PPO ratio supplies the importance weight.
    """
    rhos = torch.exp(log_rhos)
    valid_f, not_term, cont = _episode_masks(terminated, truncated, valid, values.dtype)
    clipped_rhos = torch.clamp(rhos, max=rho_clip) * valid_f
    cs = lam * torch.clamp(rhos, max=c_clip)
    deltas = clipped_rhos * (rewards + gamma * not_term * values[1:] - values[:-1])

    vs_minus_v = torch.zeros_like(values)  # row T stays 0: vs_T = V(x_T)
    for t in range(rewards.shape[0] - 1, -1, -1):
        vs_minus_v[t] = deltas[t] + gamma * cs[t] * cont[t] * vs_minus_v[t + 1]
    vs = values + vs_minus_v
    advantages = (rewards + gamma * not_term * vs[1:] - values[:-1]) * valid_f
    return vs[:-1], advantages


@torch.no_grad()
def own_action_gae(
    vs: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    valid: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """GAE(lam) of each step's own action over V-trace's targets `vs` [T, B]: the
    step's TD error plus gamma * lam times the corrected tail vs_{t+1} - V(x_{t+1}),
    without the step's own importance weight. V-trace's vs_t - V(x_t) is that weight
    (min(rho-bar, rho_t), when rho-bar = c-bar) times this, so a loss that weights each
    step itself (decoupled PPO) takes this one. At lag 0 it is vs - V, GAE(lam)."""
    valid_f, not_term, cont = _episode_masks(terminated, truncated, valid, values.dtype)
    tail = torch.cat([vs[1:] - values[1:-1], torch.zeros_like(values[-1:])])
    deltas = (rewards + gamma * not_term * values[1:] - values[:-1]) * valid_f
    return deltas + gamma * lam * cont * tail


def _episode_masks(terminated: torch.Tensor, truncated: torch.Tensor, valid: torch.Tensor,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(valid, not terminated: bootstrap from the next value, the trace continues into
    the next step) as `dtype` multipliers, [T, B] each."""
    valid_f = valid.to(dtype)
    not_term = 1.0 - terminated.to(dtype)
    cont = (1.0 - (terminated | truncated).to(dtype)) * valid_f
    return valid_f, not_term, cont
