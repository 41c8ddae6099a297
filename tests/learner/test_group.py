"""The learner group's collectives and lockstep update, in real processes over gloo.

Two processes join one group through a file store (as `hetrl local --learners 2` does)
and run the same code the learner runs: the sums must be right and, whatever batch each
rank trains on (different sizes, empty minibatches, the MLP path or autograd), the ranks'
weights must stay bit-identical.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from hetrl.learner.group import (
    GroupBooks,
    LearnerGroup,
    rank_addresses,
    rank_share,
    token_proof,
    weights_sha256,
)
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.ppo import Batch, ppo_update_async
from hetrl.learner.settings import TrainSettings
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import PolicySettings
from tests.learner.test_vtrace import random_fragment

CFG = TrainSettings(epochs=2, minibatches=4, ent_coef=0.01)
OBS = gym.spaces.Box(-5.0, 5.0, (4,), np.float32)
ACTIONS = {"discrete": gym.spaces.Discrete(3),
           "continuous": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}


def batch_of(policy: Policy, seed: int, t_len: int, n: int) -> Batch:
    """A random time-major batch of `n` envs x `t_len` steps, off-policy a little."""
    rng = np.random.default_rng(seed)
    obs = torch.from_numpy((2 + 3 * rng.standard_normal((t_len + 1, n, 4))).astype(np.float32))
    with torch.no_grad():
        dist, _ = policy(obs[:-1].reshape(t_len * n, 4))
        actions = dist.sample()
        logp = dist.log_prob(actions).reshape(t_len, n)
    steps = random_fragment(seed, t_len, n)
    return Batch(observations=obs, actions=actions.reshape(t_len, n, *actions.shape[1:]),
                 rewards=steps["rewards"].float(), terminated=steps["terminated"],
                 truncated=steps["truncated"], valid=steps["valid"],
                 logprobs=logp + torch.from_numpy(rng.normal(0, 0.3, (t_len, n))
                                                  .astype(np.float32)))


def _train_rank(rank: int, store: str, kind: str, cfg: TrainSettings, same_data: bool,
                results: multiprocessing.Queue) -> None:
    torch.set_num_threads(1)
    group = LearnerGroup(rank, 2, f"file://{store}", torch.device("cpu"), timeout=60)
    torch.manual_seed(0)
    policy = Policy(OBS, ACTIONS[kind], PolicySettings(hidden_sizes=(16, 16)))
    optimizer = PolicyAdam(policy, 3e-3)
    for update in range(3):
        # Rank 1's batch is small: 1 env x 3 steps leaves some of its minibatches empty.
        shape = (8, 4) if rank == 0 or same_data else (3, 1)
        seed = 10 * update + (0 if same_data else rank)
        ppo_update_async(policy, optimizer, batch_of(policy, seed, *shape), cfg, group)
    results.put((rank, weights_sha256(policy.state_dict()),
                 {k: v.numpy().copy() for k, v in policy.state_dict().items()}))
    group.close()


def run_ranks(tmp_path: Path, kind: str, cfg: TrainSettings, same_data: bool) -> dict:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    store = str(tmp_path / "store")
    ranks = [context.Process(target=_train_rank,
                             args=(rank, store, kind, cfg, same_data, results))
             for rank in range(2)]
    for process in ranks:
        process.start()
    out: dict[int, tuple[str, dict]] = {}
    for _ in ranks:
        rank, sha, state = results.get(timeout=120)
        out[rank] = (sha, state)
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    return out


@pytest.mark.slow
@pytest.mark.lowest
@pytest.mark.parametrize("gradients", ["auto", "autograd"])
@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_ranks_on_different_batches_keep_identical_weights(tmp_path: Path, kind: str,
                                                           gradients: str) -> None:
    out = run_ranks(tmp_path, kind, dataclasses.replace(CFG, gradients=gradients),
                    same_data=False)
    assert out[0][0] == out[1][0], "the ranks' weights differ"
    torch.manual_seed(0)
    start = Policy(OBS, ACTIONS[kind], PolicySettings(hidden_sizes=(16, 16))).state_dict()
    assert any(not np.array_equal(out[0][1][k], v.numpy()) for k, v in start.items()), \
        "nothing was trained"


@pytest.mark.slow
@pytest.mark.lowest
def test_two_ranks_on_the_same_batch_train_as_one(tmp_path: Path) -> None:
    # Each rank's gradient is the solo gradient, so their mean is too; the normaliser's
    # combined moments are the batch's own (up to rounding). One minibatch per epoch:
    # a group splits a pass into exactly --minibatches, one rank alone may make one more.
    cfg = dataclasses.replace(CFG, gradients="autograd", minibatches=1)
    out = run_ranks(tmp_path, "continuous", cfg, same_data=True)
    torch.manual_seed(0)
    policy = Policy(OBS, ACTIONS["continuous"], PolicySettings(hidden_sizes=(16, 16)))
    optimizer = PolicyAdam(policy, 3e-3)
    for update in range(3):
        ppo_update_async(policy, optimizer, batch_of(policy, 10 * update, 8, 4), cfg)
    for name, value in policy.state_dict().items():
        if name == "obs_rms.count":  # the group saw every observation twice
            np.testing.assert_allclose(out[0][1][name] - 1e-4, 2 * (value.numpy() - 1e-4))
            continue
        np.testing.assert_allclose(out[0][1][name], value.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def _collectives_rank(rank: int, store: str, results: multiprocessing.Queue) -> None:
    group = LearnerGroup(rank, 2, f"file://{store}", torch.device("cpu"), timeout=60)
    tensor = torch.tensor([1.0, 2.0]) + 2 * rank
    group.average_(tensor)
    rows = np.arange(5 * 3, dtype=np.float64).reshape(5, 3) ** 1.5 if rank == 0 else \
        np.full((2, 3), 7.0)
    data = torch.from_numpy(rows)
    moments = group.combine_moments(len(rows), data.mean(0), data.var(0, unbiased=False))
    turns = group.agree({"rank": rank, "text": "x" * (10 + 100 * rank)})
    # Unequal batches (10 and 5 samples, 2 minibatches each: 5+5 and 2+3): each rank's
    # minibatch gradient weighs as many samples as it holds.
    shares = group.minibatch_shares(10 if rank == 0 else 5, 2)
    weighted = torch.tensor([1.0, 2.0]) + 7 * rank
    group.average_(weighted, shares[0])
    results.put((rank, tensor.tolist(), moments[0], moments[1].tolist(), moments[2].tolist(),
                 turns, shares, weighted.tolist()))
    group.close()


def test_collectives_sum_what_every_rank_sent(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=_collectives_rank,
                             args=(rank, str(tmp_path / "store"), results)) for rank in range(2)]
    for process in ranks:
        process.start()
    got = sorted(results.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(30)
    everything = np.concatenate([np.arange(15, dtype=np.float64).reshape(5, 3) ** 1.5,
                                 np.full((2, 3), 7.0)])
    for rank, average, count, mean, var, turns, shares, weighted in got:
        assert average == [2.0, 3.0]
        assert shares == pytest.approx([5 / 7, 5 / 8] if rank == 0 else [2 / 7, 3 / 8])
        # (5 x [1, 2] + 2 x [8, 9]) / 7
        assert weighted == pytest.approx([3.0, 4.0])
        assert count == 7
        np.testing.assert_allclose(mean, everything.mean(0), rtol=1e-12)
        np.testing.assert_allclose(var, everything.var(0), rtol=1e-9)
        assert [t["rank"] for t in turns] == [0, 1] and len(turns[1]["text"]) == 110


def test_a_rank_that_dies_breaks_the_group_for_the_others(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    survivor = context.Process(target=_survivor, args=(str(tmp_path / "store"), results))
    doomed = context.Process(target=_doomed, args=(str(tmp_path / "store"),))
    survivor.start()
    doomed.start()
    kind, message = results.get(timeout=120)
    survivor.join(30)
    doomed.join(30)
    assert kind == "GroupError", message
    assert "another rank died or stopped answering" in message
    assert "This is typically" not in message  # gloo's advice is left out


def _survivor(store: str, results: multiprocessing.Queue) -> None:
    group = LearnerGroup(0, 2, f"file://{store}", torch.device("cpu"), timeout=60)
    group.agree({})
    try:
        group.agree({})  # rank 1 is gone by now
        results.put(("nothing", ""))
    except Exception as exc:  # noqa: BLE001 - the test reports what it was
        results.put((type(exc).__name__, str(exc)))
        # A broken group refuses at once, without waiting for anyone.
        try:
            group.agree({})
        except Exception as again:  # noqa: BLE001
            assert type(again) is type(exc)


def _doomed(store: str) -> None:
    import os

    group = LearnerGroup(1, 2, f"file://{store}", torch.device("cpu"), timeout=60)
    group.agree({})
    os._exit(9)  # died: no goodbye


def test_workers_are_split_the_same_way_everywhere() -> None:
    addresses = ["b:2", "a:1", "b:1", "a:2", "c:1"]
    parts = [rank_addresses(addresses, rank, 2) for rank in range(2)]
    assert parts == [("a:1", "b:1", "c:1"), ("a:2", "b:2")]
    assert parts == [rank_addresses(list(reversed(addresses)), rank, 2) for rank in range(2)]


@pytest.mark.parametrize("total", [1, 2, 7, 16])
def test_batch_shares_sum_to_the_groups_batch(total: int) -> None:
    workers = [3, 2, 2]
    shares = [rank_share(total, rank, workers) for rank in range(3)]
    assert all(share >= 1 for share in shares)
    if total >= 3:
        assert sum(shares) == total
        assert shares[0] >= shares[1]


def test_group_books_sum_the_turns() -> None:
    books = GroupBooks()
    books.restore(1000)
    books.episodes, books.dropped_lag = 5, 1
    books.rebase()

    def turn(steps, episodes, returns, wait, lockstep, train):
        return {"steps": steps, "episodes": episodes, "returns": returns, "dropped": 0,
                "lags": {"0": 2, "1": 1}, "wait": wait, "lockstep": lockstep, "train": train}

    books.fold([turn(100, 2, [1.0, 2.0], 1.0, 0.0, 3.0), turn(50, 1, [3.0], 0.5, 1.5, 2.0)])
    assert books.global_step == 1150 and books.episodes == 8 and books.dropped_lag == 1
    assert books.lag_histogram == {0: 4, 1: 2}
    assert books.progress() == (1150, (1.0, 2.0, 3.0))
    assert books.wait_shares() == [0.25, 0.5] and books.lockstep_shares() == [0.0, 0.375]


def _token_rank(rank: int, store: str, token: str, results: multiprocessing.Queue) -> None:
    try:
        LearnerGroup(rank, 2, f"file://{store}", torch.device("cpu"), timeout=60, token=token)
        results.put((rank, "joined"))
    except Exception as exc:  # noqa: BLE001 - the test reports what it was
        results.put((rank, f"{type(exc).__name__}: {exc}"))


@pytest.mark.parametrize("tokens, joined", [(("job", "job"), True), (("job", "other"), False)])
def test_every_rank_proves_it_holds_the_jobs_token(tmp_path: Path, tokens, joined) -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=_token_rank,
                             args=(rank, str(tmp_path / "store"), tokens[rank], results))
             for rank in range(2)]
    for process in ranks:
        process.start()
    got = dict(results.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(30)
    if joined:
        assert got == {0: "joined", 1: "joined"}
    else:  # each side sees the other as the stranger
        assert "GroupError: learner ranks [1] do not hold this job's token" in got[0]
        assert "GroupError: learner ranks [0] do not hold this job's token" in got[1]


def _stranger(store: str, sends: str, results: multiprocessing.Queue) -> None:
    """Rank 1 without the token: it replays a proof from an earlier group (made with the
    real token, for another challenge), or sends a turn no hetrl learner sends."""
    try:
        group = LearnerGroup(1, 2, f"file://{store}", torch.device("cpu"), timeout=60)
        if sends == "replay":
            group.agree({"nonce": "0" * 32})
            group.agree({"proof": token_proof("job", 1, 2, "an earlier group's challenge")})
        else:
            group.agree(["not", "a", "turn"])  # type: ignore[arg-type]
        results.put((1, "sent"))
    except Exception as exc:  # noqa: BLE001 - the test reports what it was
        results.put((1, f"{type(exc).__name__}: {exc}"))


@pytest.mark.parametrize("sends, refused", [
    ("replay", "learner ranks [1] do not hold this job's token"),
    ("garbage", "a learner rank sent a turn that is not a JSON object")])
def test_a_stranger_cannot_replay_a_proof_or_send_garbage(tmp_path: Path, sends, refused
                                                          ) -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_token_rank,
                                 args=(0, str(tmp_path / "store"), "job", results)),
                 context.Process(target=_stranger, args=(str(tmp_path / "store"), sends,
                                                          results))]
    for process in processes:
        process.start()
    got = dict(results.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(30)
    assert got[0].startswith("GroupError") and refused in got[0], got
