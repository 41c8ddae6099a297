"""Networks the benchmarks plug in with hetrl's `--policy module:Class` hook.

`SmallCNN` is a small Atari-style actor-critic (two strided convolutions, one hidden
layer, separate actor and critic heads) for (C, 84, 84) observations that the Policy
has already scaled to [0, 1]. It is here to measure learner throughput, not to be tuned.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn


class SmallCNN(nn.Module):
    """conv 16x8x8/4 -> conv 32x4x4/2 -> 256 -> (logits, value)."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.Space) -> None:
        super().__init__()
        channels = observation_space.shape[0]
        self.trunk = nn.Sequential(
            nn.Conv2d(channels, 16, 8, stride=4), nn.ReLU(),
            nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(), nn.Flatten(),
        )
        with torch.no_grad():
            n_flat = self.trunk(torch.zeros(1, *observation_space.shape)).shape[1]
        self.hidden = nn.Sequential(nn.Linear(n_flat, 256), nn.ReLU())
        n_out = int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) \
            else int(np.prod(action_space.shape))
        self.actor = nn.Linear(256, n_out)
        self.critic = nn.Linear(256, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.hidden(self.trunk(obs))
        return self.actor(h), self.critic(h).squeeze(-1)
