"""PPO's minibatch steps for hetrl's built-in MLP policy on CPU: gradients derived by hand
and computed in numpy, so the update does not pay torch's per-op cost.

A MuJoCo-sized PPO minibatch (64 samples through two 64x64 MLPs) is a few hundred
thousand multiply-adds; on CPU, torch spends several times that in dispatch and autograd
bookkeeping for the ~100 small ops of a forward and backward pass. The same maths in
numpy, with the backward pass written out, made a 2,048-sample HalfCheetah-v5 update
(10 epochs x 32 minibatches, one thread, this project's 2-core machine) take a median
109-136 ms instead of 353-460 ms through autograd (three alternating runs of six).

It is the loss of `ppo.ppo_update` exactly, not an approximation: the clipped objective
(with torch's gradient conventions at its kinks: a tie in the max splits the gradient,
a ratio on the clip boundary still passes it), the value loss (clipped under
--value-clip, with the same conventions), the entropy bonus, the
gradient-norm clip; the optimizer is still the run's `PolicyAdam`, stepping the same flat
buffer, and minibatches come from the same `torch.randperm` stream, so a seeded run
draws the same minibatches either way. Tests hold its gradients, statistics and trained
weights equal to autograd's. `for_policy` says whether it applies (the built-in MLP
actor-critic, float32, on CPU, `PolicyAdam` flat, `--gradients auto`, Discrete or Box
actions); anything else (a custom --policy, pixels, a GPU, MultiDiscrete or MultiBinary
actions) trains through autograd.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from torch import nn

from hetrl.learner.group import LearnerGroup, exact_bounds
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.settings import TrainSettings
from hetrl.rollout.policy import MLPActorCritic, Policy

_ACTIVATIONS = (nn.Tanh, nn.ReLU)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclasses.dataclass
class _Dense:
    """One linear layer as numpy views of the optimizer's flat buffers."""

    weight: np.ndarray  # [out, in]
    bias: np.ndarray
    weight_grad: np.ndarray
    bias_grad: np.ndarray


def _views(layer: nn.Linear) -> _Dense:
    assert layer.bias is not None and layer.weight.grad is not None
    assert layer.bias.grad is not None
    return _Dense(layer.weight.detach().numpy(), layer.bias.detach().numpy(),
                  layer.weight.grad.numpy(), layer.bias.grad.numpy())


def _dense_layers(net: nn.Module) -> tuple[list[nn.Linear], type[nn.Module]] | None:
    """The Linear layers of Linear, act, Linear, act, ..., Linear (one activation
    type), and that type; None for any other shape."""
    if not isinstance(net, nn.Sequential) or len(net) % 2 == 0:
        return None
    modules = list(net)
    linears = [m for m in modules[0::2] if type(m) is nn.Linear and m.bias is not None]
    acts = modules[1::2]
    if len(linears) != len(modules[0::2]):
        return None
    kinds = {type(a) for a in acts}
    if len(kinds) > 1 or not kinds <= set(_ACTIVATIONS):
        return None
    return linears, kinds.pop() if kinds else nn.Tanh


def _forward(layers: list[_Dense], x: np.ndarray, relu: bool) -> list[np.ndarray]:
    """Every layer's input and the output: [x, h1, ..., out]."""
    outs = [x]
    for i, layer in enumerate(layers):
        y = outs[-1] @ layer.weight.T
        y += layer.bias
        if i < len(layers) - 1:
            if relu:
                np.maximum(y, 0, out=y)
            else:
                np.tanh(y, out=y)
        outs.append(y)
    return outs


def _backward(layers: list[_Dense], outs: list[np.ndarray], grad_out: np.ndarray,
              relu: bool) -> None:
    """Write d loss / d weights and biases into the layers' gradient views, given
    d loss / d output; the input's gradient is not needed."""
    grad = grad_out
    for i in range(len(layers) - 1, -1, -1):
        layer = layers[i]
        np.matmul(grad.T, outs[i], out=layer.weight_grad)
        np.sum(grad, 0, out=layer.bias_grad)
        if i:
            grad = grad @ layer.weight
            h = outs[i]
            grad *= (h > 0) if relu else (1 - h * h)  # ReLU' or tanh' from the output


class MLPMinibatchSteps:
    """The epochs x minibatches of one PPO update for a policy this applies to."""

    def __init__(self, policy: Policy, optimizer: PolicyAdam, cfg: TrainSettings,
                 actor: list[nn.Linear], critic: list[nn.Linear], relu: bool,
                 group: LearnerGroup | None = None) -> None:
        self.optimizer, self.cfg, self.relu, self.group = optimizer, cfg, relu, group
        self.actor = [_views(layer) for layer in actor]
        self.critic = [_views(layer) for layer in critic]
        if policy.discrete:
            self.log_std = self.log_std_grad = None
        else:
            assert policy.log_std.grad is not None
            self.log_std = policy.log_std.detach().numpy()
            self.log_std_grad = policy.log_std.grad.numpy()
        assert optimizer.flat is not None and optimizer.flat.buffer.grad is not None
        self.grad_tensor = optimizer.flat.buffer.grad
        self.grad = self.grad_tensor.numpy()

    @classmethod
    def for_policy(cls, policy: nn.Module, optimizer: torch.optim.Optimizer,
                   cfg: TrainSettings, group: LearnerGroup | None = None
                   ) -> MLPMinibatchSteps | None:
        """The steps for this policy and optimizer, or None where only autograd can
        train them (see the module's docstring); `group`: see ppo_update_async."""
        if cfg.gradients != "auto" or not isinstance(policy, Policy):
            return None
        if not isinstance(optimizer, PolicyAdam) or optimizer.flat is None:
            return None
        buffer = optimizer.flat.buffer
        if buffer.device.type != "cpu" or buffer.dtype != torch.float32:
            return None
        net = policy.net
        if policy.action_kind not in ("categorical", "gaussian"):
            return None
        if type(net) is not MLPActorCritic or policy.scale_uint8:
            return None
        actor, critic = _dense_layers(net.actor), _dense_layers(net.critic)
        if actor is None or critic is None or actor[1] is not critic[1]:
            return None
        # Everything the optimizer trains must be something these steps write a gradient for.
        covered = [p for layer in actor[0] + critic[0] for p in (layer.weight, layer.bias)]
        if not policy.discrete:
            covered.append(policy.log_std)
        if {id(p) for p in optimizer.flat.params} != {id(p) for p in covered}:
            return None
        return cls(policy, optimizer, cfg, actor[0], critic[0], actor[1] is nn.ReLU, group)

    def train(self, obs: torch.Tensor, actions: torch.Tensor, logprobs: torch.Tensor,
              advantages: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
              mb_size: int, weights: torch.Tensor | None = None
              ) -> dict[str, torch.Tensor | float]:
        """Train cfg.epochs passes over these valid steps (`obs` already preprocessed)
        in minibatches of `mb_size`, the policy loss of each step weighted by `weights`
        when given (ppo.clip_anchor), the value loss clipped around the sampled `values`
        under --value-clip; return the statistics `ppo_update_async` reports."""
        cfg = self.cfg
        size = obs.shape[0]
        b_obs = obs.reshape(size, -1).numpy()
        b_actions = actions.numpy()
        b_logprobs, b_adv, b_returns = logprobs.numpy(), advantages.numpy(), returns.numpy()
        b_values = values.numpy()
        b_weights = None if weights is None else weights.numpy()
        clipfrac_sum, minibatches = 0.0, 0
        last: dict[str, float] = {}
        norm, actor_square = 0.0, 0.0
        with _one_blas_thread():
            exact = None if self.group is None else cfg.minibatches
            shares = (self.group.minibatch_shares(size, cfg.minibatches)
                      if self.group is not None else [])
            for _ in range(cfg.epochs):
                order = torch.randperm(size).numpy()
                for i, (start, end) in enumerate(minibatch_bounds(size, mb_size, exact)):
                    if start == end:  # a group's rank with no steps here: a zero gradient
                        self.grad.fill(0.0)
                    else:
                        mb = order[start:end]
                        last = self._gradients(b_obs[mb], b_actions[mb], b_logprobs[mb],
                                               b_adv[mb], b_returns[mb], b_values[mb],
                                               None if b_weights is None else b_weights[mb])
                        clipfrac_sum += last.pop("clipfrac")
                        minibatches += 1
                    if self.group is not None:
                        self.group.average_(self.grad_tensor, shares[i])
                    norm, actor_square = self._clip_gradient_norm()
                    self.optimizer.step()
        stats: dict[str, torch.Tensor | float] = {f"losses/{k}": v for k, v in last.items()}
        stats["losses/clipfrac"] = clipfrac_sum / max(minibatches, 1)
        if minibatches:
            stats.update(gradient_stats(norm, actor_square))
        return stats

    def _clip_gradient_norm(self) -> tuple[float, float]:
        """Clip as nn.utils.clip_grad_norm_ does (always scaled, by at most 1); return
        the norm before the clip and the actor's part of its square."""
        norm = math.sqrt(float(np.dot(self.grad, self.grad)))
        actor = sum(float(np.dot(g.ravel(), g.ravel())) for layer in self.actor
                    for g in (layer.weight_grad, layer.bias_grad))
        if self.log_std_grad is not None:
            actor += float(np.dot(self.log_std_grad, self.log_std_grad))
        self.grad *= np.float32(min(self.cfg.max_grad_norm / (norm + 1e-6), 1.0))
        return norm, actor

    def _gradients(self, obs: np.ndarray, actions: np.ndarray, old_logp: np.ndarray,
                   adv: np.ndarray, returns: np.ndarray, old_values: np.ndarray,
                   weights: np.ndarray | None) -> dict[str, float]:
        """Write the minibatch loss's gradient into the flat gradient buffer; return
        the loss statistics (before the step)."""
        cfg, n = self.cfg, obs.shape[0]
        actor_outs = _forward(self.actor, obs, self.relu)
        critic_outs = _forward(self.critic, obs, self.relu)
        head, value = actor_outs[-1], critic_outs[-1][:, 0]

        if self.log_std is None:  # categorical: log-softmax of the logits
            shifted = head - head.max(-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            probs = np.exp(log_probs)
            rows = np.arange(n)
            index = actions.astype(np.int64, copy=False)  # int64 already from the batch
            logp = log_probs[rows, index]
            entropy = -(log_probs * probs).sum(-1)
        else:  # diagonal Gaussian
            inv_std = np.exp(-self.log_std)
            z = (actions - head) * inv_std
            z2 = z * z
            logp = -0.5 * z2.sum(-1) - (self.log_std.sum() + _HALF_LOG_2PI * z.shape[-1])
            entropy_per_sample = float(self.log_std.sum()) + (0.5 + _HALF_LOG_2PI) * z.shape[-1]

        logratio = logp - old_logp
        ratio = np.exp(logratio)
        if n > 1:
            adv = (adv - adv.mean()) / (adv.std(ddof=1) + np.float32(1e-8))
        if weights is not None:  # >= 0, so it can scale the advantage inside the max
            adv = adv * weights
        low, high = 1 - cfg.clip_coef, 1 + cfg.clip_coef
        unclipped, clipped = -adv * ratio, -adv * np.clip(ratio, low, high)
        # d max(u, c) / d ratio: u's where u >= c (inside the clip range the two are
        # equal, and torch's halves of a tie add up to u's), else c's, which is zero
        # outside the range.
        share = unclipped >= clipped
        d_logp = (share * (-adv / n) * ratio).astype(np.float32)  # d pg_loss / d logp
        d_error, value_loss = _value_loss_gradient(value, returns, old_values, cfg.value_clip)
        d_value = ((cfg.vf_coef / n) * d_error).astype(np.float32)[:, None]

        if self.log_std is None:
            onehot = np.zeros_like(probs)
            onehot[rows, index] = 1.0
            d_head = d_logp[:, None] * (onehot - probs)
            if cfg.ent_coef:
                d_head += (cfg.ent_coef / n) * probs * (log_probs + entropy[:, None])
            mean_entropy = float(entropy.mean())
        else:
            assert self.log_std_grad is not None
            d_head = (d_logp[:, None] * z) * inv_std  # d logp / d mean = z / std
            np.sum(d_logp[:, None] * (z2 - 1), 0, out=self.log_std_grad)
            if cfg.ent_coef:
                self.log_std_grad -= np.float32(cfg.ent_coef)
            mean_entropy = entropy_per_sample
        _backward(self.actor, actor_outs, d_head.astype(np.float32, copy=False), self.relu)
        _backward(self.critic, critic_outs, d_value, self.relu)

        return {
            "policy_loss": float(np.maximum(unclipped, clipped).mean()),
            "value_loss": value_loss,
            "entropy": mean_entropy,
            "approx_kl": float(((ratio - 1) - logratio).mean()),
            "clipfrac": float((np.abs(ratio - 1) > cfg.clip_coef).mean()),
        }


def _value_loss_gradient(value: np.ndarray, returns: np.ndarray, old_values: np.ndarray,
                         clip: float) -> tuple[np.ndarray, float]:
    """d (0.5 x ppo.value_error) / d value for each step, and the loss's mean. Under
    `clip` the error is the larger of the value's and that of the old value moved at
    most `clip` towards it; the moved value follows the new one only inside the clip
    (clamp's gradient), and a tie splits the gradient between the two as torch's max
    does (inside the clip the two are the same value, so the halves add up)."""
    own = value - returns
    if clip <= 0:
        return own, float(0.5 * np.square(own).mean())
    step = value - old_values
    moved = old_values + np.clip(step, -clip, clip) - returns
    inside = np.abs(step) <= clip
    own2, moved2 = np.square(own), np.square(moved)
    via_moved = moved * inside
    grad = np.where(own2 > moved2, own, np.where(moved2 > own2, via_moved,
                                                 0.5 * (own + via_moved)))
    return grad, float(0.5 * np.maximum(own2, moved2).mean())


def minibatch_bounds(size: int, mb_size: int, exact: int | None = None
                     ) -> list[tuple[int, int]]:
    """(start, end) of each minibatch of one pass over `size` samples: `mb_size` each
    and a shorter last one; `exact`: exactly that many, sizes differing by at most one
    (some empty when there are fewer samples), as a learner group's ranks need, since
    they step together."""
    if exact is None:
        return [(start, min(start + mb_size, size)) for start in range(0, size, mb_size)]
    return exact_bounds(size, exact)


def gradient_stats(norm: torch.Tensor | float, actor_square: torch.Tensor | float | None
                   ) -> dict[str, torch.Tensor | float]:
    """The last minibatch's gradient norm before the clip, and the actor's share of its
    square: a critic whose loss dominates the norm leaves the policy a small step once
    --max-grad-norm scales the whole gradient down."""
    stats: dict[str, torch.Tensor | float] = {"losses/grad_norm": norm}
    if actor_square is not None:
        stats["losses/actor_grad_share"] = actor_square / (norm * norm + 1e-12)
    return stats


_controller = None


def _one_blas_thread():
    """numpy's BLAS held to one thread while the MLP trains, whatever the learner's torch
    threads: a minibatch's products (64 x 64 up to 64 x 256) are too small to share.
    Left at its default BLAS starts a thread per core (a minibatch took 0.64 against
    0.35 ms on 2 loaded cores), and following --learner-torch-threads 2 it made a quiet
    2-core machine's update 6x slower for 64x64 layers (Humanoid's spaces: 6,060 against
    37,635 samples/s) and 2.4x slower for 256x256 (bench.learner_throughput's "2 thr")."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController
        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")
