"""Recurrent policies (--recurrent lstm|gru): the hidden state a worker carries, what a
fragment says of it, and a learner that replays each env's sequence exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetrl.learner.ppo import Batch, ppo_update
from hetrl.learner.settings import TrainSettings
from hetrl.protos import hetrl_pb2
from hetrl.rollout.collector import Collector
from hetrl.rollout.envs import action_dtype, action_shape, describe_env, make_vector_env
from hetrl.rollout.errors import ConfigError, WireFormatError
from hetrl.rollout.fragments import (
    FragmentArrays,
    expected_steps,
    flat_steps,
    from_message,
    nested_steps,
    serialize,
)
from hetrl.rollout.observations import ObsLayout, tree_map
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import PolicySettings, WorkerSettings

CUE = "tests.fixtures.envs:RememberCue"


def collector(env: str, recurrent: str, n: int = 3, length: int = 7, rnn: int = 16):
    settings = WorkerSettings(env=env, envs_per_worker=n, fragment_length=length,
                              recurrent=recurrent, rnn_size=rnn)
    envs = make_vector_env(settings, n)
    policy = Policy(envs.single_observation_space, envs.single_action_space, settings)
    return Collector(envs, policy, length, seed=3), policy


def replayed_logprobs(policy: Policy, fragment: FragmentArrays) -> np.ndarray:
    """What the learner's update computes as the target log-probabilities."""
    t_len, n = fragment.rewards.shape
    obs = tree_map(lambda o: torch.from_numpy(o.reshape(-1, *o.shape[2:])),
                   fragment.observations)
    with torch.no_grad():
        dist, _, _ = policy.sequence(obs, torch.from_numpy(fragment.starts),
                                     torch.from_numpy(fragment.initial_state[0]))
        actions = torch.from_numpy(fragment.actions.reshape(t_len * n, *fragment.actions.shape[2:]))
        padded = torch.cat([actions, actions[:n]])
        return dist.log_prob(padded)[: t_len * n].reshape(t_len, n).numpy()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_each_fragment_carries_where_episodes_start_and_the_state_before_it(kind) -> None:
    c, policy = collector(CUE, kind)
    size = policy.state_size
    assert size == (32 if kind == "lstm" else 16)
    first = c.collect()
    assert first.starts.shape == (8, 3) and first.initial_state.shape == (1, 3, size)
    assert first.starts[0].all() and not first.initial_state.any()  # fresh envs
    # RememberCue's episodes last 5 steps, then a reset step: observation 6 starts one
    np.testing.assert_array_equal(first.starts[:, 0], [1, 0, 0, 0, 0, 0, 1, 0])
    second = c.collect()
    assert second.initial_state.any()  # the memory goes on across fragments
    np.testing.assert_array_equal(second.starts[0], first.starts[-1])


@pytest.mark.parametrize("env, kind", [(CUE, "lstm"), (CUE, "gru"),
                                       ("tests.fixtures.envs:EveryLeaf", "lstm")])
def test_the_learner_replays_each_sequence_exactly(env, kind) -> None:
    c, policy = collector(env, kind, n=4, length=11)
    for _ in range(3):  # later fragments start mid-episode, from a carried state
        fragment = c.collect()
        np.testing.assert_allclose(replayed_logprobs(policy, fragment), fragment.logprobs,
                                   atol=1e-5)


def test_a_recurrent_fragment_survives_the_wire_and_a_mismatched_learner_is_told() -> None:
    c, policy = collector(CUE, "lstm")
    fragment = c.collect()
    layout = ObsLayout.box((5,), np.float32)
    act = (action_shape(c.envs.single_action_space), action_dtype(c.envs.single_action_space))
    message = hetrl_pb2.WorkerMessage.FromString(serialize(fragment, 0, "i", 0, 0)).fragment
    received = from_message(message, expected_steps(7, 3, layout, *act, policy.state_size))
    np.testing.assert_array_equal(received.arrays.starts, fragment.starts)
    np.testing.assert_array_equal(received.arrays.initial_state, fragment.initial_state)
    with pytest.raises(WireFormatError, match="from a recurrent policy; this learner's"):
        from_message(message, expected_steps(7, 3, layout, *act))
    with pytest.raises(WireFormatError, match="initial_state: got"):
        from_message(message, expected_steps(7, 3, layout, *act, 8))
    feed_forward, _ = collector(CUE, "none")
    plain = feed_forward.collect()
    assert plain.starts is None and plain.initial_state is None
    message = hetrl_pb2.WorkerMessage.FromString(serialize(plain, 0, "i", 0, 0)).fragment
    assert not message.HasField("starts")  # a feed-forward run's bytes are as before
    with pytest.raises(WireFormatError, match="without starts"):
        from_message(message, expected_steps(7, 3, layout, *act, policy.state_size))


def test_an_update_trains_on_sequences_and_keeps_the_replay_exact() -> None:
    c, policy = collector(CUE, "lstm", n=4, length=10)
    fragment = c.collect()
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in flat_steps(fragment).items()}
    stats = ppo_update(policy, torch.optim.Adam(policy.parameters(), 1e-3),
                       Batch(**nested_steps(tensors)), TrainSettings(minibatches=2))
    assert all(np.isfinite(v) for v in stats.values()), stats
    assert stats["charts/samples_trained"] == float(fragment.valid.sum())
    # the weights changed, and the collector samples with the new ones from here
    after = c.collect()
    np.testing.assert_allclose(replayed_logprobs(policy, after), after.logprobs, atol=1e-5)


def test_a_custom_policy_cannot_be_made_recurrent() -> None:
    with pytest.raises(ConfigError, match="--recurrent builds hetrl's own network"):
        PolicySettings(policy="my.mod:Net", recurrent="lstm")


def test_a_loaded_recurrent_policy_acts_with_its_state() -> None:
    from hetrl.rollout.evaluate import TrainedPolicy

    settings = WorkerSettings(env=CUE, recurrent="gru", rnn_size=8)
    d = describe_env(settings)
    policy = Policy(d.observation_space, d.action_space, settings)
    trained = TrainedPolicy(policy, settings, settings, d.observation_space, d.action_space, {})
    assert trained.recurrent
    obs = np.eye(5, dtype=np.float32)[0]
    action, state = trained.act(obs, deterministic=True)
    assert 0 <= action < 4 and state.shape == (8,)
    again, later = trained.act(np.zeros(5, np.float32), deterministic=True, state=state)
    assert later.shape == (8,) and not np.allclose(later, state)
    batch_actions, batch_state = trained.act(np.stack([obs, obs]), state=None)
    assert batch_actions.shape == (2,) and batch_state.shape == (2, 8)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_state_is_zero_at_an_episode_start_and_carried_otherwise(kind) -> None:
    settings = WorkerSettings(env=CUE, recurrent=kind, rnn_size=8)
    d = describe_env(settings)
    policy = Policy(d.observation_space, d.action_space, settings)
    obs = torch.rand(2, 5)
    old = torch.randn(2, policy.state_size)
    starts = torch.tensor([[True, False]])
    with torch.no_grad():
        dist, value, _ = policy.sequence(obs, starts, old)
        fresh, fresh_value, _ = policy.sequence(obs, starts, torch.zeros_like(old))
    # env 0 starts an episode: what came before cannot matter; env 1's memory does
    torch.testing.assert_close(dist.logits[0], fresh.logits[0])
    torch.testing.assert_close(value[0], fresh_value[0])
    assert not torch.allclose(value[1], fresh_value[1])


def test_clip_against_learner_anchors_each_sequence_on_its_replay_and_weights_it(
        monkeypatch) -> None:
    """--clip-against learner on the recurrent path: every minibatch of env columns
    takes the replayed log-probs as its anchor (so the first step's ratio is 1) and
    min(rho-bar, replayed / behaviour) as its weights, column for column."""
    import hetrl.learner.ppo as ppo

    c, policy = collector(CUE, "lstm", n=4, length=10)
    fragment = c.collect()
    batch = Batch(**nested_steps({k: torch.from_numpy(np.array(v))
                                  for k, v in flat_steps(fragment).items()}))
    replayed = torch.from_numpy(replayed_logprobs(policy, fragment))
    batch.logprobs = replayed + torch.from_numpy(  # lagged behaviour
        np.random.default_rng(0).normal(0, 0.3, replayed.shape).astype(np.float32))
    seen, orders, targets = [], [], []
    step, randperm, anchor = ppo._Minibatches.step, torch.randperm, ppo.clip_anchor

    def spy(self, dist, new_value, actions, logprobs, weights, *rest, mask=None):
        seen.append((dist.log_prob(actions)[mask].detach(), logprobs, weights, mask))
        return step(self, dist, new_value, actions, logprobs, weights, *rest, mask=mask)

    monkeypatch.setattr(ppo._Minibatches, "step", spy)
    # the update's own replay, after it moved the observation normaliser
    monkeypatch.setattr(ppo, "clip_anchor", lambda target, *rest: targets.append(target)
                        or anchor(target, *rest))
    monkeypatch.setattr(torch, "randperm", lambda *a, **k: orders.append(randperm(*a, **k))
                        or orders[-1])
    cfg = TrainSettings(epochs=1, minibatches=2, clip_against="learner")
    ppo_update(policy, torch.optim.Adam(policy.parameters(), 1e-3), batch, cfg)
    torch.testing.assert_close(targets[0], replayed, atol=1e-2, rtol=0)
    replayed = targets[0]
    expected = torch.exp(replayed - batch.logprobs).clamp(max=1.0)
    assert len(seen) == 2
    torch.testing.assert_close(seen[0][0], seen[0][1], atol=1e-5, rtol=0)  # ratio 1
    for (_, anchor, weights, mask), cols in zip(seen, orders[0].split(2), strict=True):
        torch.testing.assert_close(anchor, replayed[:, cols].reshape(-1)[mask],
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(weights, expected[:, cols].reshape(-1)[mask])
    assert (seen[0][2] < 1).any() and (seen[0][2] == 1).any()
