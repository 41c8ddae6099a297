"""One APPO update: PPO's clipped objective against the behaviour policy, with V-trace
value targets, on a batch of fragments. Readable top to bottom, CleanRL style.

The batch is time-major: observations [T+1, B, ...], the rest [T, B]. Ratios are taken
against the behaviour log-probs the workers sent, so experience from slightly older
weights is corrected rather than trusted; or (--clip-against learner) against the
learner's policy as the update starts, each step weighted by its truncated importance
weight over the behaviour policy. Only `valid` steps are trained on. No I/O here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from hetrl.learner.group import LearnerGroup
from hetrl.learner.mlp_ppo import MLPMinibatchSteps, gradient_stats, minibatch_bounds
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.settings import TrainSettings
from hetrl.learner.vtrace import own_action_gae, vtrace
from hetrl.rollout.distributions import ActionDistribution
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


def clip_anchor(target_logp: torch.Tensor, behaviour_logp: torch.Tensor,
                cfg: TrainSettings) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs PPO's ratio is taken against, per-step weights of the policy loss or
    None): the behaviour's and no weights, or (--clip-against learner) the learner's
    as the update starts and min(rho-bar, learner / behaviour), which corrects for lag
    in the gradient's expectation where the ratio no longer does (the advantages then
    carry no weight of their own: `own_action_gae`, or V-trace's, which never do)."""
    if cfg.clip_against == "behaviour":
        return behaviour_logp, None
    weights = torch.exp(target_logp - behaviour_logp).clamp(max=cfg.vtrace_rho_clip)
    return target_logp, weights


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
    policy: Policy, optimizer: torch.optim.Optimizer, batch: Batch, cfg: TrainSettings,
    group: LearnerGroup | None = None,
) -> dict[str, torch.Tensor | float]:
    """ppo_update without reading anything back: the loss metrics stay on the device
    (read them with `read_stats`), so that a GPU update runs without a host sync when
    the batch carries `valid_index` / `valid_count`.

    `group`: this batch is one rank's part of a learner group's (learner/group.py):
    the normaliser folds the group's moments, every epoch takes exactly cfg.minibatches
    steps (an empty one too) and each step's gradient is the ranks' mean."""
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
        policy.update_normalizer(tree_map(lambda o: o[: t_len * n][keep], flat_obs),
                                 None if group is None else group.combine_moments)

    # V-trace targets under the current policy, computed once per batch.
    with torch.no_grad():
        flat_actions = batch.actions.reshape(t_len * n, *batch.actions.shape[2:])
        # Normalised once: the statistics stay fixed during the update. Pixels stay
        # uint8 until a minibatch needs them (a quarter of the memory).
        once = policy.preprocess_once
        net_obs = policy.preprocess(flat_obs) if once else flat_obs
        if policy.state_size:  # each env's sequence replayed from the fragment's state
            assert batch.starts is not None and batch.initial_state is not None
            dist, values, _ = policy.sequence(net_obs, batch.starts, batch.initial_state[0],
                                              preprocessed=once)
            # the last row's distribution is the bootstrap step's: not needed
            target_logp = dist.log_prob(torch.cat([flat_actions, flat_actions[:n]])
                                        )[: t_len * n].reshape(t_len, n)
        else:
            heads, values = policy.heads(net_obs, preprocessed=once)
            step_dist = policy.distribution(heads[: t_len * n])
            target_logp = step_dist.log_prob(flat_actions).reshape(t_len, n)
        values = values.reshape(t_len + 1, n)
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
        if cfg.advantages == "gae" and cfg.clip_against == "learner":
            # clip_anchor weights each step: the advantage must not carry the weight too
            advantages = own_action_gae(vs, batch.rewards * cfg.reward_scale, values,
                                        batch.terminated, batch.truncated, batch.valid,
                                        cfg.gamma, cfg.gae_lambda)
        elif cfg.advantages == "gae":
            advantages = gae_advantages(vs, values, batch.valid)
        anchor_logp, lag_weights = clip_anchor(target_logp, batch.logprobs, cfg)
        # --clip-against learner's mean weight: 1 at lag 0, lower as lag grows
        lag_stats = ({} if lag_weights is None else
                     {"losses/lag_weight_mean": lag_weights.reshape(-1)[keep].mean()})

    if isinstance(optimizer, PolicyAdam):
        optimizer.check()  # its flat buffer still holds the policy's parameters
    if policy.state_size:
        stats = _sequence_minibatches(policy, optimizer, cfg, batch, net_obs, anchor_logp,
                                      lag_weights, advantages, vs, values[:-1], once, group)
        stats["losses/explained_variance"] = _explained_variance(
            values[:-1].reshape(-1)[keep], vs.reshape(-1)[keep])
        stats["charts/samples_trained"] = float(size)
        return stats | lag_stats

    # Flatten the valid steps into one training set.
    b_obs = tree_map(lambda o: o[: t_len * n][keep], net_obs)
    b_actions = flat_actions[keep]
    b_logprobs = anchor_logp.reshape(-1)[keep]
    b_weights = None if lag_weights is None else lag_weights.reshape(-1)[keep]
    b_advantages = advantages.reshape(-1)[keep]
    b_returns = vs.reshape(-1)[keep]
    b_values = values[:-1].reshape(-1)[keep]
    mb_size = max(1, size // cfg.minibatches)

    steps = MLPMinibatchSteps.for_policy(policy, optimizer, cfg, group)
    if steps is not None:  # the built-in MLP on CPU: the same maths without autograd
        stats = steps.train(b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values,
                            mb_size, b_weights)
    else:
        stats = _autograd_minibatches(policy, optimizer, cfg, b_obs, b_actions, b_logprobs,
                                      b_weights, b_advantages, b_returns, b_values, mb_size,
                                      once, group)
    stats["losses/explained_variance"] = _explained_variance(b_values, b_returns)
    stats["charts/samples_trained"] = float(size)
    return stats | lag_stats


class _Minibatches:
    """The optimiser's side of cfg.epochs passes of minibatch steps through autograd,
    flat (`_autograd_minibatches`) or by env sequences (`_sequence_minibatches`): one
    step's loss, clip and update, and the statistics `ppo_update_async` reports (the
    last minibatch's losses, as CleanRL reports them, and the mean clip fraction)."""

    def __init__(self, policy: Policy, optimizer: torch.optim.Optimizer, cfg: TrainSettings,
                 device: torch.device, group: LearnerGroup | None = None) -> None:
        self.optimizer, self.cfg, self.group = optimizer, cfg, group
        # What the optimizer steps (PolicyAdam: one flat tensor), not walked per minibatch.
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.actor = policy.actor_parameters()
        self.actor_square: torch.Tensor | None = None
        self.grad_norm: torch.Tensor | None = None
        # Statistics stay on the device: the last minibatch's losses and the clip
        # fraction summed over all minibatches.
        self.clipfrac_sum = torch.zeros((), device=device)
        self.count = 0
        self.last: tuple | None = None
        self.share: float | None = None  # this rank's weight in the group's gradient

    def step(self, dist: ActionDistribution, new_value: torch.Tensor, actions: torch.Tensor,
             logprobs: torch.Tensor, weights: torch.Tensor | None, advantages: torch.Tensor,
             returns: torch.Tensor, old_values: torch.Tensor,
             mask: torch.Tensor | None = None) -> None:
        """One minibatch step; `mask` picks the rows of `dist`, `new_value` and
        `actions` to train on (the others' `logprobs`, `weights`, `advantages`,
        `returns` and `old_values`, the values as the update started, are left out
        already)."""
        cfg = self.cfg
        new_logp = dist.log_prob(actions)
        if mask is not None:
            new_logp, new_value = new_logp[mask], new_value[mask]
        logratio = new_logp - logprobs
        ratio = logratio.exp()
        with torch.no_grad():
            self.clipfrac_sum += ((ratio - 1.0).abs() > cfg.clip_coef).float().mean()
            self.count += 1

        if len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        if weights is not None:  # >= 0, so it can scale the advantage inside the max
            advantages = advantages * weights
        pg_loss = torch.max(
            -advantages * ratio,
            -advantages * torch.clamp(ratio, 1 - cfg.clip_coef, 1 + cfg.clip_coef)
        ).mean()
        v_loss = 0.5 * value_error(new_value, returns, old_values, cfg.value_clip).mean()
        loss = pg_loss + cfg.vf_coef * v_loss
        if cfg.ent_coef:  # (a zero coefficient: the entropy is only reported, below)
            loss = loss - cfg.ent_coef * _entropy(dist, mask).mean()

        self.optimizer.zero_grad()
        loss.backward()
        self._finish(pg_loss, v_loss, ratio, logratio, dist, mask)

    def empty_step(self) -> None:
        """A learner group's minibatch with no steps on this rank: a zero gradient, so
        that the rank steps with the others (their mean gradient is still a step)."""
        self.optimizer.zero_grad()
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._finish()

    def _finish(self, *last) -> None:
        """Average the gradient over the group's ranks, clip and step."""
        if self.group is not None:
            self.group.average_gradients(self.params, self.share)
        if self.actor is not None:
            self.actor_square = torch.stack([p.grad.square().sum() for p in self.actor
                                             if p.grad is not None]).sum()
        self.grad_norm = nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.optimizer.step()
        if last:  # `dist` and `logratio` hold what the policy computed before this step
            self.last = last

    def stats(self) -> dict[str, torch.Tensor | float]:
        stats: dict[str, torch.Tensor | float] = {}
        if self.last is not None:
            pg_loss, v_loss, ratio, logratio, dist, mask = self.last
            with torch.no_grad():
                stats = {"losses/policy_loss": pg_loss.detach(),
                         "losses/value_loss": v_loss.detach(),
                         "losses/entropy": _entropy(dist, mask).mean(),
                         "losses/approx_kl": ((ratio - 1) - logratio).mean()}
        stats["losses/clipfrac"] = self.clipfrac_sum / max(self.count, 1)
        if self.grad_norm is not None:
            stats.update(gradient_stats(self.grad_norm, self.actor_square))
        return stats


def value_error(new_value: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor,
                clip: float) -> torch.Tensor:
    """Each step's squared value error; with `clip` > 0 (--value-clip), the larger of it
    and the error of the old value moved at most `clip` towards the new one."""
    error = (new_value - returns).square()
    if clip <= 0:
        return error
    moved = old_values + torch.clamp(new_value - old_values, -clip, clip)
    return torch.max(error, (moved - returns).square())


def _entropy(dist: ActionDistribution, mask: torch.Tensor | None) -> torch.Tensor:
    entropy = dist.entropy()
    return entropy if mask is None else entropy[mask]


def _autograd_minibatches(
    policy: Policy, optimizer: torch.optim.Optimizer, cfg: TrainSettings,
    b_obs: Obs, b_actions: torch.Tensor, b_logprobs: torch.Tensor,
    b_weights: torch.Tensor | None, b_advantages: torch.Tensor, b_returns: torch.Tensor,
    b_values: torch.Tensor, mb_size: int, preprocessed: bool,
    group: LearnerGroup | None = None,
) -> dict[str, torch.Tensor | float]:
    """cfg.epochs passes of minibatch steps through autograd over the flat valid steps."""
    size = b_actions.shape[0]
    steps = _Minibatches(policy, optimizer, cfg, b_actions.device, group)
    exact = None if group is None else cfg.minibatches
    shares = group.minibatch_shares(size, cfg.minibatches) if group is not None else []
    for _ in range(cfg.epochs):
        b_inds = torch.randperm(size, device=b_actions.device)
        for i, (start, end) in enumerate(minibatch_bounds(size, mb_size, exact)):
            steps.share = shares[i] if shares else None
            if start == end:
                steps.empty_step()
                continue
            mb_inds = b_inds[start:end]
            dist, new_value = policy(tree_map(lambda o: o[mb_inds], b_obs),  # noqa: B023
                                     preprocessed=preprocessed)
            steps.step(dist, new_value, b_actions[mb_inds], b_logprobs[mb_inds],
                       None if b_weights is None else b_weights[mb_inds],
                       b_advantages[mb_inds], b_returns[mb_inds], b_values[mb_inds])
    return steps.stats()


def _sequence_minibatches(
    policy: Policy, optimizer: torch.optim.Optimizer, cfg: TrainSettings, batch: Batch,
    net_obs: Obs, anchor_logp: torch.Tensor, weights: torch.Tensor | None,
    advantages: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor,
    preprocessed: bool, group: LearnerGroup | None = None,
) -> dict[str, torch.Tensor | float]:
    """A recurrent policy's cfg.epochs passes: minibatches of whole env columns, each
    replayed as a T-step sequence from its fragment's state (truncated BPTT, the state
    zeroed at episode starts), the loss over its valid steps (CleanRL's
    ppo_atari_lstm)."""
    t_len, n = batch.rewards.shape
    assert batch.starts is not None and batch.initial_state is not None
    device = batch.rewards.device
    # [T * N, ...] time-major -> [T, N, ...], so a minibatch takes env columns.
    steps_obs = tree_map(lambda o: o[: t_len * n].reshape(t_len, n, *o.shape[1:]), net_obs)
    actions = batch.actions
    starts, state = batch.starts[:t_len], batch.initial_state[0]
    envs_per_minibatch = max(1, n // cfg.minibatches)
    steps = _Minibatches(policy, optimizer, cfg, device, group)
    exact = None if group is None else cfg.minibatches
    # Weighed by env columns (of equal length T), not by their valid steps.
    shares = group.minibatch_shares(n, cfg.minibatches) if group is not None else []
    for _ in range(cfg.epochs):
        columns = torch.randperm(n, device=device)
        for i, (start, end) in enumerate(minibatch_bounds(n, envs_per_minibatch, exact)):
            steps.share = shares[i] if shares else None
            cols = columns[start:end]
            if start == end:
                steps.empty_step()
                continue
            mb_obs = tree_map(lambda o: o[:, cols].reshape(-1, *o.shape[2:]),  # noqa: B023
                              steps_obs)
            dist, new_value, _ = policy.sequence(mb_obs, starts[:, cols], state[cols],
                                                 preprocessed=preprocessed)
            valid = batch.valid[:, cols].reshape(-1)
            if not bool(valid.any()):
                if group is not None:
                    steps.empty_step()
                continue
            steps.step(dist, new_value, actions[:, cols].reshape(-1, *actions.shape[2:]),
                       anchor_logp[:, cols].reshape(-1)[valid],
                       None if weights is None else weights[:, cols].reshape(-1)[valid],
                       advantages[:, cols].reshape(-1)[valid],
                       returns[:, cols].reshape(-1)[valid],
                       old_values[:, cols].reshape(-1)[valid], mask=valid)
    return steps.stats()
