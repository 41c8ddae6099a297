"""The actor-critic policy that workers sample from and the learner trains.

Both sides build it from the same spaces and `PolicySettings`, so a state dict moves
between them as named arrays (`policy_arrays` / `load_policy_arrays`), never pickled.
Discrete actions use a categorical head, MultiDiscrete one categorical per choice,
MultiBinary one Bernoulli per bit, and Box actions (any shape, flattened) a diagonal
Gaussian whose samples are clipped to [-1, 1] and rescaled to the env's bounds before
stepping (the raw sample is what gets trained on); `env_actions` gives the env its own
shape and offsets back. Observations are a Box's array or, for a Dict or Tuple space,
its leaves by path (rollout/observations.py): the built-in network for those encodes
each leaf (a CNN per image, one-hot choices, vectors as they are) and joins them before
the actor and critic MLPs. Observation normalisation statistics (per float leaf) are
buffers of the module, so they travel with the weights. No gRPC, no envs here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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
from hetrl.rollout.observations import (
    BINARY,
    IMAGE,
    ONE_HOT,
    Leaf,
    Obs,
    ObsLayout,
    batch_size,
    is_image,
    tree_map,
)
from hetrl.rollout.settings import PolicySettings

MomentsCombiner = Callable[[int, torch.Tensor, torch.Tensor],
                          tuple[int, torch.Tensor, torch.Tensor]]
"""(count, mean, variance) of one part of a batch -> the same of the whole batch."""


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
    def update(self, batch: torch.Tensor, combine: MomentsCombiner | None = None) -> None:
        """Fold `batch` in; `combine`: turns this batch's (count, mean, variance) into
        those of a larger batch it is part of (a learner group's, across its ranks)."""
        batch = batch.reshape(-1, *self.mean.shape).to(torch.float64)
        n = batch.shape[0]
        if n == 0 and combine is None:
            return
        if n:
            b_mean, b_var = batch.mean(0), batch.var(0, unbiased=False)
        else:
            b_mean, b_var = torch.zeros_like(self.mean), torch.zeros_like(self.var)
        if combine is not None:
            n, b_mean, b_var = combine(n, b_mean, b_var)
            if n == 0:
                return
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


def image_channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image of this shape is (H, W, C) rather than (C, H, W): the channel
    axis is the short one (<= 4) of the two ends; (H, W, C) when both or neither are."""
    if len(shape) == 2:
        return True  # (H, W): one channel, added last
    first, last = shape[0] <= 4, shape[-1] <= 4
    return last or not first


def _conv(n_in: int, n_out: int, kernel: int, stride: int, padding: int = 0) -> nn.Conv2d:
    conv = nn.Conv2d(n_in, n_out, kernel, stride, padding)
    nn.init.orthogonal_(conv.weight, math.sqrt(2))
    nn.init.zeros_(conv.bias)  # type: ignore[arg-type]  # a Conv2d made with bias has one
    return conv


class ImageEncoder(nn.Module):
    """A CNN for one image leaf ([B, H, W, C], [B, C, H, W] or [B, H, W], scaled to
    [0, 1]), sized to the image: the Nature DQN stack from 64 pixels a side (84x84
    Atari frames), strided 4x4 and 3x3 convolutions from 16, and two padded 3x3
    convolutions below that (grids such as MiniGrid's 7x7 would vanish under strides);
    then one `features`-wide layer."""

    FEATURES = 256

    def __init__(self, shape: tuple[int, ...], features: int = FEATURES) -> None:
        super().__init__()
        self.channels_last = image_channels_last(shape)
        self.add_channel = len(shape) == 2
        if self.add_channel:
            channels, side = 1, min(shape)
        elif self.channels_last:
            channels, side = shape[-1], min(shape[:2])
        else:
            channels, side = shape[0], min(shape[1:])
        if side >= 64:
            layers = [_conv(channels, 32, 8, 4), nn.ReLU(), _conv(32, 64, 4, 2), nn.ReLU(),
                      _conv(64, 64, 3, 1), nn.ReLU()]
        elif side >= 16:
            layers = [_conv(channels, 32, 4, 2), nn.ReLU(), _conv(32, 64, 3, 2), nn.ReLU(),
                      _conv(64, 64, 3, 1), nn.ReLU()]
        else:
            layers = [_conv(channels, 16, 3, 1, 1), nn.ReLU(), _conv(16, 32, 3, 1, 1),
                      nn.ReLU()]
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(self._channels_first(torch.zeros(1, *shape))).shape[1]
        self.out = nn.Sequential(_layer(flat, features, math.sqrt(2)), nn.ReLU())

    def _channels_first(self, images: torch.Tensor) -> torch.Tensor:
        if self.add_channel:
            return images.unsqueeze(1)
        return images.permute(0, 3, 1, 2) if self.channels_last else images

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.out(self.convs(self._channels_first(images)))


class ImageActorCritic(nn.Module):
    """The built-in network for a Box of pixels (uint8, (H, W), (H, W, C) or (C, H, W),
    a frame stack counting as channels): the Nature DQN network of CleanRL's ppo_atari
    for 84x84 Atari stacks (`ImageEncoder` to 512 features, shared by a linear actor
    head and a linear critic), a smaller CNN for small images."""

    FEATURES = 512

    def __init__(self, shape: tuple[int, ...], head_dim: int) -> None:
        super().__init__()
        self.encoder = ImageEncoder(shape, self.FEATURES)
        self.actor = _layer(self.FEATURES, head_dim, 0.01)
        self.critic = _layer(self.FEATURES, 1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(obs)
        return self.actor(features), self.critic(features).squeeze(-1)


def _module_key(leaf: str) -> str:
    """A leaf's path as a module name (torch allows no "." in those, nor an empty one)."""
    return "leaf:" + leaf.replace(".", ":")


class MultiInputActorCritic(nn.Module):
    """The built-in network for Dict and Tuple observations: each image leaf through
    its own CNN (shared by actor and critic), every other leaf flat as `preprocess`
    encoded it (normalised vector, one-hot choices, bits), all joined, then the
    actor and critic MLPs of `MLPActorCritic`."""

    def __init__(self, layout: ObsLayout, head_dim: int, settings: PolicySettings) -> None:
        super().__init__()
        self.layout = layout
        self.images = nn.ModuleDict({_module_key(leaf.name): ImageEncoder(leaf.shape)
                                     for leaf in layout.leaves if leaf.encoding == IMAGE})
        width = sum(ImageEncoder.FEATURES if leaf.encoding == IMAGE else leaf.width
                    for leaf in layout.leaves)
        act = {"tanh": nn.Tanh, "relu": nn.ReLU}[settings.activation]
        self.actor = _mlp(width, settings.hidden_sizes, head_dim, act, 0.01)
        self.critic = _mlp(width, settings.hidden_sizes, 1, act, 1.0)

    def forward(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [self.images[_module_key(leaf.name)](obs[leaf.name])
                 if leaf.encoding == IMAGE else obs[leaf.name].flatten(1)
                 for leaf in self.layout.leaves]
        joined = torch.cat(parts, 1)
        return self.actor(joined), self.critic(joined).squeeze(-1)


class RecurrentActorCritic(nn.Module):
    """The built-in network with a memory (--recurrent lstm|gru), CleanRL's
    ppo_atari_lstm layout: the observation's features (flat, or a nested space's leaves
    joined as `MultiInputActorCritic` joins them) through one layer of
    hidden_sizes[0], an LSTM or GRU cell of --rnn-size, then actor and critic MLPs over
    the rest of hidden_sizes. The hidden state is [B, S] floats (an LSTM's h and c side
    by side), zeroed before every observation that starts an episode."""

    def __init__(self, layout: ObsLayout, head_dim: int, settings: PolicySettings) -> None:
        super().__init__()
        self.layout = layout
        self.images = nn.ModuleDict({_module_key(leaf.name): ImageEncoder(leaf.shape)
                                     for leaf in layout.leaves
                                     if layout.nested and leaf.encoding == IMAGE})
        width = sum(ImageEncoder.FEATURES if _module_key(leaf.name) in self.images
                    else leaf.width for leaf in layout.leaves)
        act = {"tanh": nn.Tanh, "relu": nn.ReLU}[settings.activation]
        first, rest = settings.hidden_sizes[0], settings.hidden_sizes[1:]
        self.encoder = nn.Sequential(_layer(width, first, math.sqrt(2)), act())
        self.lstm = settings.recurrent == "lstm"
        self.rnn_size = settings.rnn_size
        self.core = (nn.LSTMCell if self.lstm else nn.GRUCell)(first, settings.rnn_size)
        for name, param in self.core.named_parameters():
            if "bias" in name:
                nn.init.zeros_(param)
            else:
                nn.init.orthogonal_(param, 1.0)
        self.state_size = settings.rnn_size * (2 if self.lstm else 1)
        self.actor = _mlp(settings.rnn_size, rest, head_dim, act, 0.01)
        self.critic = _mlp(settings.rnn_size, rest, 1, act, 1.0)

    def _features(self, obs: Obs) -> torch.Tensor:
        if not self.layout.nested:
            return obs.flatten(1)
        return torch.cat([self.images[_module_key(leaf.name)](obs[leaf.name])
                          if _module_key(leaf.name) in self.images
                          else obs[leaf.name].flatten(1) for leaf in self.layout.leaves], 1)

    def sequence(self, obs: Obs, starts: torch.Tensor, state: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Heads and values of T steps of B envs (`obs` [T * B, ...], time-major),
        from `state` [B, S] with the state zeroed where `starts` [T, B]; and the
        state after the last step."""
        t_len, n = starts.shape
        x = self.encoder(self._features(obs)).reshape(t_len, n, -1)
        keep = (~starts).to(x.dtype).unsqueeze(-1)
        outputs = []
        for t in range(t_len):
            state = state * keep[t]
            if self.lstm:
                h, c = self.core(x[t], tuple(state.split(self.rnn_size, 1)))
                state = torch.cat([h, c], 1)
            else:
                h = state = self.core(x[t], state)
            outputs.append(h)
        out = torch.cat(outputs)
        return self.actor(out), self.critic(out).squeeze(-1), state

    def forward(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from a zero state (what a feed-forward caller, e.g. `hetrl plan`, gets)."""
        n = batch_size(obs)
        device = next(self.parameters()).device
        head, value, _ = self.sequence(obs, torch.ones(1, n, dtype=torch.bool, device=device),
                                       torch.zeros(n, self.state_size, device=device))
        return head, value


def _encode_leaf(leaf: Leaf, x: torch.Tensor, rms: RunningMeanStd | None) -> torch.Tensor:
    """One leaf as every network receives it: float, an image in [0, 1], a choice
    one-hot ([B, sum of its sizes]), a vector normalised when statistics are kept."""
    if leaf.encoding == IMAGE:
        return x.float() / 255.0
    if leaf.encoding == ONE_HOT:
        flat = x.reshape(len(x), -1).long()
        start = torch.as_tensor(leaf.start, device=x.device)
        sizes = torch.as_tensor(leaf.sizes, device=x.device)
        offsets = torch.cumsum(sizes, 0) - sizes
        index = (flat - start).clamp(min=0).minimum(sizes - 1) + offsets
        out = torch.zeros(len(x), int(sum(leaf.sizes)), device=x.device)
        return out.scatter_(1, index, 1.0)
    x = x.float()
    if leaf.encoding == BINARY or rms is None:
        return x
    return rms(x)


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
        self, observation_space: gym.Space, action_space: gym.Space, settings: PolicySettings
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
        self.obs_layout = ObsLayout.of(observation_space)
        nested = self.obs_layout.nested
        self.scale_uint8 = not nested and np.dtype(observation_space.dtype) == np.uint8
        self.obs_rms: RunningMeanStd | None = None
        self.leaf_rms = nn.ModuleDict()
        """A nested space's float leaves' statistics, by `_module_key`."""
        if settings.normalize_observations and not self.scale_uint8:
            if not nested:
                self.obs_rms = RunningMeanStd(tuple(observation_space.shape or ()))
            for leaf in self.obs_layout.leaves if nested else ():
                if leaf.normalized:
                    self.leaf_rms[_module_key(leaf.name)] = RunningMeanStd(leaf.shape)
        self.net: nn.Module
        if settings.recurrent != "none":
            self.net = RecurrentActorCritic(self.obs_layout, head_dim, settings)
        elif settings.policy:
            self.net = _load_custom(settings.policy, observation_space, action_space)
        elif nested:
            self.net = MultiInputActorCritic(self.obs_layout, head_dim, settings)
        elif self.scale_uint8 and is_image(observation_space.shape, np.uint8):
            self.net = ImageActorCritic(tuple(observation_space.shape or ()), head_dim)
        else:
            obs_dim = int(np.prod(observation_space.shape or ()))
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
        if not isinstance(self.net, (MLPActorCritic, MultiInputActorCritic,
                                     RecurrentActorCritic, ImageActorCritic)):
            return None
        extra = [self.log_std] if hasattr(self, "log_std") else []
        return [*self.net.actor.parameters(), *extra]

    def preprocess(self, obs: Obs) -> Obs:
        """Observations as the network sees them: float, scaled or normalized (a
        nested space's leaves each by its kind, see `_encode_leaf`)."""
        if self.obs_layout.nested:
            stats = {key: rms for key, rms in self.leaf_rms.items()
                     if isinstance(rms, RunningMeanStd)}
            return {leaf.name: _encode_leaf(leaf, obs[leaf.name],
                                            stats.get(_module_key(leaf.name)))
                    for leaf in self.obs_layout.leaves}
        if self.scale_uint8:
            return obs.float() / 255.0
        obs = obs.float()
        return self.obs_rms(obs) if self.obs_rms is not None else obs

    @property
    def preprocess_once(self) -> bool:
        """Whether a whole batch may be preprocessed at once: not when it holds images,
        which stay uint8 until a minibatch needs them (a quarter of the memory)."""
        return not self.scale_uint8 and not any(leaf.encoding == IMAGE
                                                 for leaf in self.obs_layout.leaves
                                                 if self.obs_layout.nested)

    @torch.no_grad()
    def update_normalizer(self, obs: Obs, combine: MomentsCombiner | None = None) -> None:
        """Fold a batch of observations ([B, ...] per leaf) into the running statistics
        (`combine`: see RunningMeanStd.update)."""
        if self.obs_rms is not None:
            self.obs_rms.update(obs, combine)
        for leaf in self.obs_layout.leaves if self.obs_layout.nested else ():
            key = _module_key(leaf.name)
            if key in self.leaf_rms:
                rms = self.leaf_rms[key]
                assert isinstance(rms, RunningMeanStd)
                rms.update(obs[leaf.name], combine)

    def heads(self, obs: Obs, preprocessed: bool = False
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

    def forward(self, obs: Obs, preprocessed: bool = False
                ) -> tuple[ActionDistribution, torch.Tensor]:
        head, value = self.heads(obs, preprocessed)
        return self.distribution(head), value

    @property
    def state_size(self) -> int:
        """Numbers of hidden state per env (0: a feed-forward policy)."""
        return self.net.state_size if isinstance(self.net, RecurrentActorCritic) else 0

    def sequence(self, obs: Obs, starts: torch.Tensor, state: torch.Tensor,
                 preprocessed: bool = False
                 ) -> tuple[ActionDistribution, torch.Tensor, torch.Tensor]:
        """A recurrent policy over T steps of B envs (`obs` [T * B, ...] time-major,
        `starts` [T, B], `state` [B, S] before the first): the action distribution
        and value of every step, and the state after the last."""
        assert isinstance(self.net, RecurrentActorCritic)
        head, value, state = self.net.sequence(obs if preprocessed else self.preprocess(obs),
                                               starts, state)
        return self.distribution(head), value, state

    @torch.no_grad()
    def act_recurrent(self, obs: Obs, state: np.ndarray, starts: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`act` for a recurrent policy: sample from each env's state (zeroed where
        `starts`); return (actions, log-probs, the new states)."""
        dist, _, new_state = self.sequence(tree_map(torch.from_numpy, obs),
                                           torch.from_numpy(starts)[None],
                                           torch.from_numpy(state))
        actions = dist.sample()
        return actions.numpy(), dist.log_prob(actions).numpy(), new_state.numpy()

    @torch.no_grad()
    def act(self, obs: Obs) -> tuple[np.ndarray, np.ndarray]:
        """Sample actions for a batch of observations; return (actions, log-probs)."""
        dist, _ = self(tree_map(torch.from_numpy, obs))
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
