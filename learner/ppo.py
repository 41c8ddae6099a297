"""One APPO update: PPO's clipped objective against the behaviour policy, with V-trace
value targets, on a batch of fragments. Readable top to bottom, CleanRL style.

The batch is time-major: observations [T+1, B, ...], the rest [T, B]. Ratios are taken
against the behaviour log-probs the workers sent, so experience from slightly older
weights is corrected rather than trusted. Only `valid` steps are trained on. No I/O here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from hetrl.learner.mlp_ppo import MLPMinibatchSteps, gradient_stats
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.settings import TrainSettings
from hetrl.learner.vtrace import vtrace
from hetrl.rollout.fragments import Steps
from hetrl.rollout.observations import Obs, tree_map
from hetrl.rollout.policy import Policy


@dataclasses.dataclass
class Batch(Steps[torch.Tensor]):
    """Training tensors on the learner's device: the fragments' step arrays (`Steps`,
    the same fields by the same names) side by side along the env axis."""

    valid_index: torch.Tensor | None = None
    """Flat positions of the valid steps, or None when every step is valid; with
    `valid_count`, computed on the host by whoever built the batch, so that the update
    need not ask the device (a host sync) how many steps to train on."""
    valid_count: int | None = None
    """Number of valid steps; None: the update counts them itself (one host sync)."""


def explained_variance(pred: np.ndarray, target: np.ndarray) -> float:
    var = np.var(target)
    return float("nan") if var == 0 else float(1 - np.var(target - pred) / var)


def _explained_variance(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """explained_variance on the device (NaN when the target is constant), no sync."""
    var = target.var(unbiased=False)
    return torch.where(var == 0, torch.full_like(var, float("nan")),
                       1 - (target - pred).var(unbiased=False) / var)


def gae_advantages(vs: torch.Tensor, values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """vs - V(x_t) on valid steps: GAE(lambda) when on-policy (--advantages gae)."""
    return (vs - values[:-1]) * valid.to(values.dtype)


def read_stats(stats: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """Bring an update's statistics to the host: one transfer (one sync) for all of them."""
    tensors = {k: v for k, v in stats.items() if isinstance(v, torch.Tensor)}
    out = {k: float(v) for k, v in stats.items() if not isinstance(v, torch.Tensor)}
    if tensors:
        values = torch.stack([v.detach().float().reshape(()) for v in tensors.values()]).tolist()
        out.update(zip(tensors, values, strict=True))
    return out


def ppo_update(
    policy: Policy, optimizer: torch.optim.Optimizer, batch: Batch, cfg: TrainSettings
) -> dict[str, float]:
    """Train on one batch for cfg.epochs x cfg.minibatches steps; return loss metrics."""
    return read_stats(ppo_update_async(policy, optimizer, batch, cfg))


def ppo_update_async(
    policy: Policy, optimizer: torch.optim.Optimizer, batch: Batch, cfg: TrainSettings
) -> dict[str, torch.Tensor | float]:
    """ppo_update without reading anything back: the loss metrics stay on the device
    (read them with `read_stats`), so that a GPU update runs without a host sync when
    the batch carries `valid_index` / `valid_count`."""
    t_len, n = batch.rewards.shape
    # Index with the positions of valid steps (a boolean mask copies far slower, and
    # asks the device for its size); when every step is valid, take views.
    if batch.valid_count is None:
        mask = batch.valid.reshape(-1)
        size = int(mask.sum())
        keep: slice | torch.Tensor = (slice(None) if size == mask.numel()
                                      else mask.nonzero().squeeze(1))
    else:
        size = batch.valid_count
        keep = slice(None) if batch.valid_index is None else batch.valid_index
    # [T + 1, B, ...] -> [(T + 1) * B, ...], leaf by leaf for a nested space.
    flat_obs = tree_map(lambda o: o.reshape(-1, *o.shape[2:]), batch.observations)
    if policy.obs_rms is not None or len(policy.leaf_rms):
        policy.update_normalizer(tree_map(lambda o: o[: t_len * n][keep], flat_obs))

    # V-trace targets under the current policy, computed once per batch.
    with torch.no_grad():
        flat_actions = batch.actions.reshape(t_len * n, *batch.actions.shape[2:])
        # Normalised once: the statistics stay fixed during the update. Pixels stay
        # uint8 until a minibatch needs them (a quarter of the memory).
        once = policy.preprocess_once
        net_obs = policy.preprocess(flat_obs) if once else flat_obs
        heads, values = policy.heads(net_obs, preprocessed=once)
        values = values.reshape(t_len + 1, n)
        step_dist = policy.distribution(heads[: t_len * n])
        target_logp = step_dist.log_prob(flat_actions).reshape(t_len, n)
        vs, advantages = vtrace(
            target_logp - batch.logprobs,
            batch.rewards * cfg.reward_scale,
            values,
            batch.terminated,
            batch.truncated,
            batch.valid,
            cfg.gamma,
            cfg.gae_lambda,
            cfg.vtrace_rho_clip,
            cfg.vtrace_c_clip,
        )
        if cfg.advantages == "gae":
            advantages = gae_advantages(vs, values, batch.valid)

    # Flatten the valid steps into one training set.
    b_obs = tree_map(lambda o: o[: t_len * n][keep], net_obs)
    b_actions = flat_actions[keep]
    b_logprobs = batch.logprobs.reshape(-1)[keep]
    b_advantages = advantages.reshape(-1)[keep]
    b_returns = vs.reshape(-1)[keep]
    b_values = values[:-1].reshape(-1)[keep]
    mb_size = max(1, size // cfg.minibatches)

    if isinstance(optimizer, PolicyAdam):
        optimizer.check()  # its flat buffer still holds the policy's parameters
    steps = MLPMinibatchSteps.for_policy(policy, optimizer, cfg)
    if steps is not None:  # the built-in MLP on CPU: the same maths without autograd
        stats = steps.train(b_obs, b_actions, b_logprobs, b_advantages, b_returns, mb_size)
    else:
        stats = _autograd_minibatches(policy, optimizer, cfg, b_obs, b_actions, b_logprobs,
                                      b_advantages, b_returns, mb_size, once)
    stats["losses/explained_variance"] = _explained_variance(b_values, b_returns)
    stats["charts/samples_trained"] = float(size)
    return stats


def _autograd_minibatches(
    policy: Policy, optimizer: torch.optim.Optimizer, cfg: TrainSettings,
    b_obs: Obs, b_actions: torch.Tensor, b_logprobs: torch.Tensor,
    b_advantages: torch.Tensor, b_returns: torch.Tensor, mb_size: int, preprocessed: bool,
) -> dict[str, torch.Tensor | float]:
    """cfg.epochs passes of minibatch steps through autograd; the statistics as
    `ppo_update_async` reports them."""
    size = b_actions.shape[0]
    device = b_actions.device
    # Statistics stay on the device: the last minibatch's losses and the clip fraction
    # summed over all minibatches. Per minibatch, only what the step needs is computed.
    clipfrac_sum = torch.zeros((), device=device)
    # What the optimizer steps (PolicyAdam: one flat tensor), not walked per minibatch.
    params = [p for group in optimizer.param_groups for p in group["params"]]
    actor = policy.actor_parameters()
    actor_square = grad_norm = None
    minibatch_count = 0
    for _ in range(cfg.epochs):
        b_inds = torch.randperm(size, device=device)
        for start in range(0, size, mb_size):
            mb_inds = b_inds[start : start + mb_size]
            dist, new_value = policy(tree_map(lambda o: o[mb_inds], b_obs),  # noqa: B023
                                     preprocessed=preprocessed)
            new_logp = dist.log_prob(b_actions[mb_inds])
            logratio = new_logp - b_logprobs[mb_inds]
            ratio = logratio.exp()
            with torch.no_grad():
                clipfrac_sum += ((ratio - 1.0).abs() > cfg.clip_coef).float().mean()
                minibatch_count += 1

            mb_adv = b_advantages[mb_inds]
            if len(mb_inds) > 1:
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
            pg_loss = torch.max(
                -mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - cfg.clip_coef, 1 + cfg.clip_coef)
            ).mean()
            v_loss = 0.5 * (new_value - b_returns[mb_inds]).square().mean()
            loss = pg_loss + cfg.vf_coef * v_loss
            if cfg.ent_coef:  # (a zero coefficient: the entropy is only reported, below)
                loss = loss - cfg.ent_coef * dist.entropy().mean()

            optimizer.zero_grad()
            loss.backward()
            if actor is not None:
                actor_square = torch.stack([p.grad.square().sum() for p in actor
                                            if p.grad is not None]).sum()
            grad_norm = nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()

    # The last minibatch's statistics, as CleanRL reports them (`dist` and `logratio`
    # hold what the policy computed before that minibatch's step).
    stats: dict[str, torch.Tensor | float] = {}
    if minibatch_count:
        with torch.no_grad():
            stats = {
                "losses/policy_loss": pg_loss.detach(),
                "losses/value_loss": v_loss.detach(),
                "losses/entropy": dist.entropy().mean(),
                "losses/approx_kl": ((ratio - 1) - logratio).mean(),
            }
    stats["losses/clipfrac"] = clipfrac_sum / max(minibatch_count, 1)
    if grad_norm is not None:
        stats.update(gradient_stats(grad_norm, actor_square))
    return stats

