"""Reward shaping for training: sign clipping (--clip-rewards), and normalisation, the
rewards divided by the running std of the return.

Each worker keeps, for each of its envs, the discounted return so far
(R <- gamma * R + r, restarted at every episode end) and the running variance of those
returns over all its envs; a fragment's rewards are divided by that std (after the
statistics take in the fragment) and clipped. This is the usual PPO reward scaling for
MuJoCo; per worker is correct in a distributed run, since it changes only the training
signal. It must not touch the episode returns a fragment reports: those stay raw, so
the curves read in the env's own units (sign clipping likewise). Steps with valid = 0
(autoreset steps and aborted episodes) neither update the statistics nor carry a
reward. No torch here.
"""

from __future__ import annotations

import numpy as np


def clip_rewards(rewards: np.ndarray) -> np.ndarray:
    """Rewards as their sign (--clip-rewards), float32; masked steps' zeros stay zero."""
    return np.sign(rewards).astype(np.float32)


def training_rewards(rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                     valid: np.ndarray, clip: bool, normalizer: RewardNormalizer | None
                     ) -> np.ndarray:
    """A fragment's rewards as training sees them: sign-clipped (--clip-rewards), then
    normalised (--normalize-rewards), each as asked; where a worker or central inference
    cuts a fragment (its episode returns stay raw)."""
    if clip:
        rewards = clip_rewards(rewards)
    if normalizer is not None:
        rewards = normalizer(rewards, terminated, truncated, valid)
    return rewards


class RunningVariance:
    """Running mean and variance of scalars (parallel Welford), in float64."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def update(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        n = values.size
        if n == 0:
            return
        b_mean, b_var = float(values.mean()), float(values.var())
        delta, total = b_mean - self.mean, self.count + n
        m2 = self.var * self.count + b_var * n + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total


class RewardNormalizer:
    """Scales the rewards of consecutive fragments of one vector env (num_envs columns)."""

    def __init__(self, num_envs: int, gamma: float, clip: float, epsilon: float = 1e-8) -> None:
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.stats = RunningVariance()

    def __call__(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                 valid: np.ndarray) -> np.ndarray:
        """Normalised float32 copy of time-major rewards [T, N]; updates the statistics.

        Returns continue across calls, so fragments must come in the order collected.
        """
        seen = np.empty(rewards.shape, dtype=np.float64)
        for t in range(rewards.shape[0]):
            # An invalid step (a reset step, an aborted episode) restarts the return.
            self.returns = np.where(valid[t], self.returns * self.gamma + rewards[t], 0.0)
            seen[t] = self.returns
            self.returns[terminated[t] | truncated[t]] = 0.0
        self.stats.update(seen[valid])
        scaled = rewards / np.sqrt(self.stats.var + self.epsilon)
        scaled = np.clip(scaled, -self.clip, self.clip) if self.clip > 0 else scaled
        return np.where(valid, scaled, 0.0).astype(np.float32)
