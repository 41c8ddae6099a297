"""The learner group: the ranks of one data-parallel learner, over torch.distributed.

With `--learners N`, N learner processes train one policy. Each rank takes its own share
of the workers (`rank_addresses`: every process computes the same partition), batches
their fragments through the usual pipeline, and steps in lockstep with the others:

- before each update the ranks `agree`: one all-gather of every rank's turn (has it a
  batch, does it stop and why, its books so far), after which every rank knows the same
  things and decides the same way: all train, or all stop (one rank's stop, failure or
  spent budget stops them all); the group's steps, episodes, returns and waits are summed
  from the turns (`GroupBooks`);
- inside the update, every minibatch's gradient (the optimizer's flat buffer, so the
  numpy MLP path and autograd alike) is averaged over the ranks before the norm clip
  and the Adam step, and the observation normaliser folds the group's batch moments:
  every rank keeps bit-identical weights, which `weights_sha256` lets the books prove;
- the start state (fresh or resumed, rank 0's) is broadcast to every rank.

Env hosts never join. Nothing is pickled: a turn travels as JSON bytes in a uint8
tensor. Gloo on CPU; with CUDA, NCCL for the gradients and gloo for the turns. A rank
that dies or stops answering surfaces here as a GroupError in every other rank (gloo
notices a closed connection at once; a hung peer after GROUP_TIMEOUT_SECONDS). This
module only talks to the other ranks: what to do with what they say is the learner's.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from hetrl.rollout.errors import ConfigError, HetrlError
from hetrl.rollout.models import RETURN_WINDOW

log = logging.getLogger("hetrl.learner")

GROUP_TIMEOUT_SECONDS = 600.0
"""How long a rank waits for the others in one collective (a turn waits for the slowest
rank's batch) before the group counts them gone."""

T = TypeVar("T")


class GroupError(HetrlError):
    """Another rank of the learner group died or stopped answering: the group stops."""


def _cause(exc: BaseException) -> str:
    """torch.distributed's error, short: gloo's `[file:line]` prefix and its advice to
    read the remote worker's logs (the learner's message says which) left out."""
    text = " ".join(str(exc).split()) or repr(exc)
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". This is typically")[0][:300]


def rank_addresses(addresses: Sequence[str], rank: int, ranks: int) -> tuple[str, ...]:
    """This rank's share of the workers: every `ranks`-th of the addresses in sorted
    order, from the `rank`-th (so a host's workers are spread over the ranks, and every
    process that knows the addresses computes the same partition)."""
    return tuple(sorted(addresses)[rank::ranks])


MAX_TURN_BYTES = 64 << 20
"""The largest turn a rank accepts (a turn is a few kB of books): a bigger one is not
from a hetrl learner, and allocating it could exhaust memory."""


def exact_bounds(size: int, count: int) -> list[tuple[int, int]]:
    """(start, end) of exactly `count` minibatches over `size` samples, sizes differing
    by at most one (some empty when there are fewer samples): a group's ranks step
    together, so each takes the same number of steps whatever its batch."""
    return [(size * i // count, size * (i + 1) // count) for i in range(count)]


def token_proof(token: str, rank: int, ranks: int, challenge: str) -> str:
    """What rank `rank` shows the group to prove it holds `token`, for this `challenge`."""
    return hmac.new(token.encode(), f"hetrl learner rank {rank} of {ranks}, {challenge}"
                    .encode(), hashlib.sha256).hexdigest()


class _Malformed(ValueError):
    """A turn no hetrl learner sends."""


def rank_share(total: int, rank: int, weights: Sequence[int]) -> int:
    """This rank's part of `total` (e.g. --fragments-per-batch) in proportion to
    `weights` (each rank's workers), the parts summing to `total`, each at least 1."""
    whole, before = sum(weights), sum(weights[:rank])
    upto = before + weights[rank]
    return max(1, round(total * upto / whole) - round(total * before / whole))


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    """A checksum of a state dict's tensors, by name: equal on two ranks exactly when
    their weights (and normaliser statistics) are bit-identical."""
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class LearnerGroup:
    """One rank's membership of the group; `join` it, call the collectives in the same
    order on every rank, `close` at the end.

    Lifecycle: a collective that fails (a rank gone) raises GroupError and marks the
    group `broken`: every later collective raises at once, so a stopping rank never
    waits for peers that cannot answer.
    """

    def __init__(self, rank: int, ranks: int, rendezvous: str, device: torch.device,
                 timeout: float = GROUP_TIMEOUT_SECONDS, token: str = "") -> None:
        if not 0 <= rank < ranks:
            raise ConfigError(f"rank {rank} is not one of the group's {ranks} ranks")
        self.rank, self.ranks, self.device = rank, ranks, device
        self.broken: str | None = None
        # Cumulative seconds this rank spent in gradient all-reduces (the summary's
        # all-reduce cost per update).
        self.reduce_seconds = 0.0
        self.reduces = 0
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        # tcp://host:port (rank 0 listens there) or file:///path (one machine, no port).
        init = rendezvous if "://" in rendezvous else f"tcp://{rendezvous}"
        log.info("learner rank %d of %d joining the group at %s (%s)", rank, ranks, init,
                 backend)
        try:
            dist.init_process_group(backend, init_method=init, rank=rank, world_size=ranks,
                                    timeout=datetime.timedelta(seconds=timeout))
        except (RuntimeError, ValueError) as exc:
            raise GroupError(f"learner rank {rank} could not join the group of {ranks} at "
                             f"{init} within {timeout:.0f} s: {exc}") from exc
        if token:
            self._prove_token(token)

    def _prove_token(self, token: str) -> None:
        """Every rank shows the others it holds the job's token: an HMAC, under the token,
        of its rank and a challenge made of a fresh random value from every rank (so a
        proof seen in one group is worth nothing in the next). The rendezvous itself is
        not authenticated, so a process that took a rank's place ends the group with
        this error instead of training in it.

        Raises:
            GroupError: some rank does not hold the token.
        """
        challenge = "".join(str(t.get("nonce"))[:64]
                            for t in self.agree({"nonce": secrets.token_hex(16)}))

        turns = self.agree({"proof": token_proof(token, self.rank, self.ranks, challenge)})
        strangers = [r for r, t in enumerate(turns) if not hmac.compare_digest(
            str(t.get("proof")).encode(),
            token_proof(token, r, self.ranks, challenge).encode())]
        if strangers:
            self.broken = (f"learner ranks {strangers} do not hold this job's token: a "
                           "process that is not one of this job's learners joined the group "
                           "at its rendezvous (or the hosts were started with different "
                           "HETRL_TOKEN values); the group stops")
            raise GroupError(self.broken)

    @property
    def leader(self) -> bool:
        """Rank 0: the one that writes the run's outputs."""
        return self.rank == 0

    def _collective(self, what: str, call: Callable[[], T]) -> T:
        if self.broken is not None:
            raise GroupError(self.broken)
        try:
            return call()
        except _Malformed:
            raise
        except (RuntimeError, ValueError) as exc:  # DistBackendError is a RuntimeError
            self.broken = (f"the learner group broke during {what}: another rank died or "
                           f"stopped answering ({_cause(exc)}); the group stops")
            raise GroupError(self.broken) from exc

    # -- the turns ---------------------------------------------------------------
    def agree(self, turn: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's `turn` (JSON-able), in rank order, on every rank."""
        data = torch.frombuffer(bytearray(json.dumps(turn).encode()), dtype=torch.uint8)

        def gather() -> list[dict[str, Any]]:
            size = torch.tensor([data.numel()], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.ranks)]
            dist.all_gather(sizes, size)
            longest = int(max(s.item() for s in sizes))
            if longest > MAX_TURN_BYTES or min(s.item() for s in sizes) < 0:
                raise _Malformed(f"a turn of {longest:,} bytes (at most {MAX_TURN_BYTES:,})")
            padded = torch.zeros(longest, dtype=torch.uint8)
            padded[: data.numel()] = data
            parts = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.ranks)]
            dist.all_gather(parts, padded)
            try:
                turns = [json.loads(bytes(p[: int(s.item())].numpy()).decode())
                         for p, s in zip(parts, sizes, strict=True)]
            except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError
                raise _Malformed(f"a turn that is not JSON ({exc})") from exc
            if not all(isinstance(t, dict) for t in turns):
                raise _Malformed("a turn that is not a JSON object")
            return turns

        try:
            return self._collective("a turn", gather)
        except _Malformed as exc:
            self.broken = (f"a learner rank sent {exc}: not a hetrl learner of this version; "
                           "the group stops")
            raise GroupError(self.broken) from exc

    # -- inside an update --------------------------------------------------------
    def minibatch_shares(self, size: int, minibatches: int) -> list[float]:
        """This rank's share of each of the group's minibatches: its samples there over
        all ranks' (each rank splits its `size` samples as `exact_bounds` does), so that
        the group's gradient weighs every sample alike when the ranks' batches differ
        (one tiny all-gather per update)."""
        mine = torch.tensor([size], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.ranks)]
        self._collective("the batch sizes", lambda: dist.all_gather(sizes, mine))
        parts = [[end - start for start, end in exact_bounds(int(n.item()), minibatches)]
                 for n in sizes]
        totals = [sum(column) for column in zip(*parts, strict=True)]
        return [m / t if t else 0.0 for m, t in zip(parts[self.rank], totals, strict=True)]

    def average_(self, tensor: torch.Tensor, share: float | None = None) -> None:
        """Replace `tensor` by its mean over the ranks, in place (bit-identical on all);
        `share`: this rank's weight in a weighted mean (the shares sum to 1)."""
        start = time.perf_counter()

        def reduce() -> None:
            if share is not None:
                tensor.mul_(share)
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            if share is None:
                tensor.div_(self.ranks)

        self._collective("a gradient all-reduce", reduce)
        self.reduce_seconds += time.perf_counter() - start
        self.reduces += 1

    def average_gradients(self, params: Sequence[torch.Tensor], share: float | None = None
                          ) -> None:
        """Average the gradients of `params` over the ranks (a missing one counts as
        zero; `share`: see average_): PolicyAdam's flat buffer is one tensor, so one
        all-reduce per step."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.average_(p.grad, share)

    def combine_moments(self, count: int, mean: torch.Tensor, var: torch.Tensor
                        ) -> tuple[int, torch.Tensor, torch.Tensor]:
        """The count, mean and (population) variance of the group's batch, from each
        rank's own: what the observation normaliser folds on every rank."""
        sums = torch.cat([torch.tensor([float(count)], dtype=torch.float64),
                          (mean * count).reshape(-1).double().cpu(),
                          ((var + mean.square()) * count).reshape(-1).double().cpu()])
        self._collective("the normaliser's moments",
                         lambda: dist.all_reduce(sums, op=dist.ReduceOp.SUM))
        n = int(sums[0].item())
        if n == 0:
            return 0, mean, var
        k = mean.numel()
        total_mean = (sums[1 : 1 + k] / n).reshape(mean.shape).to(mean)
        total_var = (sums[1 + k :] / n).reshape(mean.shape).to(var) - total_mean.square()
        return n, total_mean, total_var.clamp_min(0.0)

    # -- at the start --------------------------------------------------------------
    def broadcast_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Overwrite `tensors` on every rank with rank 0's (same shapes everywhere)."""

        def send() -> None:
            for tensor in tensors:
                # Gloo broadcasts CPU tensors; a CUDA tensor goes through NCCL.
                dist.broadcast(tensor, src=0)

        self._collective("the start state's broadcast", send)

    def close(self) -> None:
        """Leave the group (a broken group is abandoned, not waited for)."""
        if not dist.is_initialized():
            return
        if self.broken is None:
            try:
                dist.destroy_process_group()
            except (RuntimeError, ValueError) as exc:
                log.debug("leaving the learner group: %s", exc)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's state tensors in a fixed order, created (zero) where this rank has
    none yet, so that rank 0's can be broadcast into them: Adam's step and moments."""
    tensors = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if "exp_avg" not in state:
                fused = bool(group.get("fused") or group.get("capturable"))
                state["step"] = torch.zeros((), dtype=torch.float32,
                                            device=p.device if fused else "cpu")
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            step = state["step"]
            if not isinstance(step, torch.Tensor):
                state["step"] = step = torch.tensor(float(step))
            tensors += [step, state["exp_avg"], state["exp_avg_sq"]]
    return tensors


@dataclasses.dataclass
class GroupBooks:
    """The group's counts, summed from every rank's turn, where the run's books read a
    batcher's: global step, episodes, last 100 returns, fragments dropped for lag and
    the lag histogram; plus each rank's waits. Every rank keeps the same books."""

    base_step: int = 0
    base_episodes: int = 0
    base_dropped: int = 0
    base_lags: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    global_step: int = 0
    episodes: int = 0
    dropped_lag: int = 0
    lag_histogram: collections.Counter[int] = dataclasses.field(
        default_factory=collections.Counter)
    recent_returns: collections.deque[float] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=RETURN_WINDOW))
    rank_wait_seconds: list[float] = dataclasses.field(default_factory=list)
    """Each rank's wait for its own batch, summed."""
    rank_lockstep_seconds: list[float] = dataclasses.field(default_factory=list)
    """Each rank's wait for the others in the turns (its batch was ready, theirs not)."""
    rank_train_seconds: list[float] = dataclasses.field(default_factory=list)
    rank_steps: list[int] = dataclasses.field(default_factory=list)

    def restore(self, step: int) -> None:
        """Continue from a checkpoint at `step` (the batchers count from 0 again); the
        episode and lag counts come back through `RunBooks.restore`, which sets them here."""
        self.base_step = self.global_step = step

    def rebase(self) -> None:
        """Take the counts `RunBooks.restore` just set as the resumed runs' share."""
        self.base_episodes, self.base_dropped = self.episodes, self.dropped_lag
        self.base_lags = collections.Counter(self.lag_histogram)

    def fold(self, turns: list[dict[str, Any]]) -> None:
        """Take in one agreement's turns (rank order): the counts are cumulative per
        rank; the returns are each rank's new ones since its last turn."""
        self.global_step = self.base_step + sum(t["steps"] for t in turns)
        self.episodes = self.base_episodes + sum(t["episodes"] for t in turns)
        self.dropped_lag = self.base_dropped + sum(t["dropped"] for t in turns)
        lags = collections.Counter(self.base_lags)
        for t in turns:
            lags.update({int(k): int(v) for k, v in t["lags"].items()})
        self.lag_histogram = lags
        for t in turns:
            self.recent_returns.extend(t["returns"])
        self.rank_wait_seconds = [float(t["wait"]) for t in turns]
        self.rank_lockstep_seconds = [float(t["lockstep"]) for t in turns]
        self.rank_train_seconds = [float(t["train"]) for t in turns]
        self.rank_steps = [int(t["steps"]) for t in turns]

    def progress(self) -> tuple[int, tuple[float, ...]]:
        """(group step, the last 100 returns) as of the last agreement."""
        return self.global_step, tuple(self.recent_returns)

    def wait_shares(self) -> list[float]:
        """Each rank's share of its time spent waiting: for its own batch, or in the
        turn for a slower rank's (lockstep's cost)."""
        return [(w + lock) / max(w + lock + t, 1e-9) for w, lock, t in
                zip(self.rank_wait_seconds, self.rank_lockstep_seconds,
                    self.rank_train_seconds, strict=True)]

    def lockstep_shares(self) -> list[float]:
        """Each rank's share of its time spent waiting for the other ranks alone."""
        return [lock / max(w + lock + t, 1e-9) for w, lock, t in
                zip(self.rank_wait_seconds, self.rank_lockstep_seconds,
                    self.rank_train_seconds, strict=True)]
