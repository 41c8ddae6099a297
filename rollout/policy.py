"""The actor-critic policy that workers sample from and the learner trains.

Both sides build it from the same spaces and `PolicySettings`, so a state dict moves
between them as named arrays (`policy_arrays` / `load_policy_arrays`), never pickled.
Discrete actions use a categorical head, MultiDiscrete one categorical per choice,
MultiBinary one Bernoulli per bit, and Box actions (any shape, flattened) a diagonal
Gaussian whose samples are clipped to [-1, 1] and rescaled to the env's bounds before
stepping (the raw sample is what gets trained on); `env_actions` gives the env its own
shape and offsets back. Observation normalisation statistics are
buffers of the module, so they travel with the weights. No gRPC, no envs here.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from hetrl.rollout.distributions import (
    ActionDistribution,
    Bernoulli,
    Categorical,
    DiagonalGaussian,
    MultiCategorical,
)
from hetrl.rollout.envs import import_user_module
from hetrl.rollout.errors import ConfigError, WireFormatError
from hetrl.rollout.settings import PolicySettings


class RunningMeanStd(nn.Module):
    """Running mean and variance of observations (parallel Welford); updated by the learner."""

    mean: torch.Tensor  # buffers, registered below (saved and sent with the weights)
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip = clip

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        batch = batch.reshape(-1, *self.mean.shape).to(torch.float64)
        n = batch.shape[0]
        if n == 0:
            return
        b_mean, b_var = batch.mean(0), batch.var(0, unbiased=False)
        delta, total = b_mean - self.mean, self.count + n
        self.mean += delta * n / total
        m2 = self.var * self.count + b_var * n + delta.square() * self.count * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        std = torch.sqrt(self.var + 1e-8).to(x.dtype)
        return torch.clamp((x - self.mean.to(x.dtype)) / std, -self.clip, self.clip)


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(n_in: int, hidden: tuple[int, ...], n_out: int, act: type[nn.Module], out_gain: float):
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [_layer(n_in, width, math.sqrt(2)), act()]
        n_in = width
    layers.append(_layer(n_in, n_out, out_gain))
    return nn.Sequential(*layers)


class MLPActorCritic(nn.Module):
    """Separate actor and critic MLPs (CleanRL's layout and initialisation)."""

    def __init__(self, obs_dim: int, head_dim: int, settings: PolicySettings) -> None:
        super().__init__()
        act = {"tanh": nn.Tanh, "relu": nn.ReLU}[settings.activation]
        self.actor = _mlp(obs_dim, settings.hidden_sizes, head_dim, act, 0.01)
        self.critic = _mlp(obs_dim, settings.hidden_sizes, 1, act, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        obs = obs.flatten(1)
        return self.actor(obs), self.critic(obs).squeeze(-1)


def _load_custom(path: str, observation_space: gym.Space, action_space: gym.Space) -> nn.Module:
    module, _, attr = path.partition(":")
    imported = import_user_module(module, f"--policy {path!r}", ConfigError)
    try:
        cls = getattr(imported, attr)
    except AttributeError as exc:
        raise ConfigError(f"--policy {path!r}: {module} has no {attr!r}") from exc
    net = cls(observation_space, action_space)
    if not isinstance(net, nn.Module):
        raise ConfigError(f"--policy {path!r} did not build a torch.nn.Module")
    return net


class Policy(nn.Module):
    """Actor-critic with action distribution, sampling and env-action mapping."""

    def __init__(
        self, observation_space: gym.spaces.Box, action_space: gym.Space, settings: PolicySettings
    ) -> None:
        super().__init__()
        self.action_kind, head_dim = _head(action_space)
        self.discrete = self.action_kind == "categorical"
        """One categorical choice (the cases hetrl's numpy update derives by hand are this
        and the Gaussian)."""
        self._env_shape = tuple(action_space.shape or ())
        self._nvec: tuple[int, ...] = ()
        self._start: np.ndarray | int = 0
        if isinstance(action_space, gym.spaces.Discrete):
            self._start = int(action_space.start)
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            self._nvec = tuple(int(n) for n in action_space.nvec.reshape(-1))
            self._start = action_space.start.reshape(-1).astype(np.int64)
        self.scale_uint8 = np.dtype(observation_space.dtype) == np.uint8
        if settings.normalize_observations and not self.scale_uint8:
            self.obs_rms: RunningMeanStd | None = RunningMeanStd(observation_space.shape)
        else:
            self.obs_rms = None
        if settings.policy:
            self.net = _load_custom(settings.policy, observation_space, action_space)
        else:
            obs_dim = int(np.prod(observation_space.shape))
            self.net = MLPActorCritic(obs_dim, head_dim, settings)
        if isinstance(action_space, gym.spaces.Box):
            self.log_std = nn.Parameter(torch.zeros(head_dim))
            low, high = action_space.low.reshape(-1), action_space.high.reshape(-1)
            self._bounded = bool(np.all(np.isfinite(low)) and np.all(np.isfinite(high)))
            self._low, self._high = low.astype(np.float32), high.astype(np.float32)

    def actor_parameters(self) -> list[nn.Parameter] | None:
        """The parameters that shape the action distribution alone (the built-in MLP's
        actor and the Gaussian's log-std), for the actor's share of the gradient; None
        for a custom --policy, whose parts hetrl cannot tell apart."""
        if not isinstance(self.net, MLPActorCritic):
            return None
        extra = [self.log_std] if hasattr(self, "log_std") else []
        return [*self.net.actor.parameters(), *extra]

    def preprocess(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations as the network sees them: float, scaled or normalized."""
        if self.scale_uint8:
            return obs.float() / 255.0
        obs = obs.float()
        return self.obs_rms(obs) if self.obs_rms is not None else obs

    def heads(self, obs: torch.Tensor, preprocessed: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw network outputs: (logits or action mean, value); `preprocessed`: `obs`
        already went through `preprocess`."""
        return self.net(obs if preprocessed else self.preprocess(obs))

    def distribution(self, head: torch.Tensor) -> ActionDistribution:
        if self.action_kind == "categorical":
            return Categorical(head)
        if self.action_kind == "multi_categorical":
            return MultiCategorical(head, self._nvec)
        if self.action_kind == "bernoulli":
            return Bernoulli(head)
        return DiagonalGaussian(head, self.log_std)

    def forward(self, obs: torch.Tensor, preprocessed: bool = False
                ) -> tuple[ActionDistribution, torch.Tensor]:
        head, value = self.heads(obs, preprocessed)
        return self.distribution(head), value

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sample actions for a batch of observations; return (actions, log-probs)."""
        dist, _ = self(torch.from_numpy(obs))
        actions = dist.sample()
        return actions.numpy(), dist.log_prob(actions).numpy()

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """Map a batch of sampled actions to what the env accepts: choices offset by the
        space's `start`, Box samples clipped to [-1, 1] and rescaled to its bounds, and
        each action in the space's own shape."""
        if self.action_kind == "gaussian" and self._bounded:
            clipped = np.clip(actions, -1.0, 1.0)
            actions = self._low + (clipped + 1.0) * 0.5 * (self._high - self._low)
        elif self.action_kind in ("categorical", "multi_categorical") and np.any(self._start):
            actions = actions + self._start
        if self.action_kind == "categorical":
            return actions
        # A copy: an env that changes its action in place must not change what is trained.
        return actions.reshape(len(actions), *self._env_shape).copy()


def _head(action_space: gym.Space) -> tuple[str, int]:
    """The kind of action distribution for a space, and how many numbers the network's
    action head gives it (logits, or the Gaussian's means)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return "categorical", int(action_space.n)
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return "multi_categorical", int(action_space.nvec.sum())
    size = int(np.prod(action_space.shape or ()))
    if isinstance(action_space, gym.spaces.MultiBinary):
        return "bernoulli", size
    return "gaussian", size


def policy_arrays(policy: nn.Module) -> dict[str, np.ndarray]:
    """The state dict as named numpy arrays (CPU copies), ready for the wire or safetensors."""
    return {k: v.detach().cpu().numpy().copy() for k, v in policy.state_dict().items()}


def load_policy_arrays(policy: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load named arrays into the policy; names, shapes and dtypes must match exactly.

    Raises:
        WireFormatError: missing, extra or mismatched tensors, or non-finite values.
    """
    state = policy.state_dict()
    missing, extra = sorted(set(state) - set(arrays)), sorted(set(arrays) - set(state))
    if missing or extra:
        raise WireFormatError(f"weights do not fit the policy: missing {missing}, extra {extra}")
    loaded = {}
    for name, current in state.items():
        array = arrays[name]
        tensor = torch.from_numpy(np.array(array, dtype=array.dtype.newbyteorder("=")))
        if tuple(tensor.shape) != tuple(current.shape) or tensor.dtype != current.dtype:
            raise WireFormatError(
                f"weight {name}: got {tuple(tensor.shape)} {tensor.dtype}, "
                f"expected {tuple(current.shape)} {current.dtype}"
            )
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise WireFormatError(f"weight {name} holds NaN or Inf; refusing to load it")
        loaded[name] = tensor
    policy.load_state_dict(loaded)
