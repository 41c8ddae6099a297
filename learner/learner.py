"""The learner process: train from every worker's stream until the step budget is spent.

Lifecycle: connect to all workers (each stream retries for `connect_timeout`), then
loop { take the next ready batch, one APPO update, offer the new weights }. Three named
threads keep the training thread on the GPU's critical path only: the stream threads
receive and decode (connections), the "batcher" returns credits, counts steps and lag,
drops fragments older than `max_policy_lag` and assembles the next batch into
preallocated host buffers and onto the device while the current one trains (batcher),
and the "weights-publisher" serializes each new version once and pushes it to every
worker (publisher). The update reads the device once (its statistics and the finite
check together). At the end, on a signal, or on an error, it saves the model
(safetensors) and a checkpoint first, then sends Stop to every worker and waits a
bounded time for their streams to end (a hung worker never delays the outputs), writes
the summary, and returns an exit code. It never spawns processes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.numpy import save as safetensors_bytes

from hetrl.learner.batcher import Batcher, ReadyBatch
from hetrl.learner.best import BestPolicy
from hetrl.learner.checkpoint import load_newest, rescue_dir, save_checkpoint, write_atomic
from hetrl.learner.connections import (
    StreamSpec,
    StreamState,
    WorkerStream,
    fan_in_bound,
)
from hetrl.learner.evaluation import PeriodicEval
from hetrl.learner.group import (
    GroupBooks,
    GroupError,
    LearnerGroup,
    optimizer_tensors,
    rank_addresses,
    rank_share,
    weights_sha256,
)
from hetrl.learner.inference import InferenceServer, check_inference_alive
from hetrl.learner.metrics import MetricsWriter, RunBooks
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.ppo import ppo_update_async, read_stats
from hetrl.learner.publisher import Publisher, weights_message
from hetrl.learner.reserve import DiskReserve
from hetrl.learner.settings import LearnerSettings, default_run_dir
from hetrl.learner.stalls import StallWatch
from hetrl.learner.utilisation import UtilisationSampler
from hetrl.learner.verdict import lockstep_note
from hetrl.rollout.envs import action_dtype, action_shape, describe_env
from hetrl.rollout.errors import ConfigError, HetrlError, NonFiniteError, OutputError
from hetrl.rollout.evaluate import model_metadata
from hetrl.rollout.exits import EXIT_FAILED, EXIT_OK
from hetrl.rollout.lifetime import exit_now, start_child
from hetrl.rollout.observations import ObsLayout
from hetrl.rollout.policy import Policy, policy_arrays
from hetrl.rollout.settings import from_json, to_json
from hetrl.rollout.transport import token_from_env, transport_options

log = logging.getLogger("hetrl.learner")

# Seconds the final Stop waits for the workers' streams to end, after the model and the
# checkpoint are written; a worker that is hung in its env never answers it.
FINAL_STOP_SECONDS = 5.0
# Seconds without a fragment from any worker, while the learner waits, that count as a
# stall (warned as it happens, and told apart from a shortage in the verdict).
STALL_SECONDS = 10.0


def resolve_device(name: str, rank: int = 0) -> torch.device:
    """--device as a torch device; `rank` of a learner group picks its own GPU (one per
    rank, round robin over this host's) where the name gives no index."""
    device = torch.device("cuda" if name == "auto" and torch.cuda.is_available()
                          else "cpu" if name == "auto" else name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
    return device


class Learner:
    """Owns the policy, the optimizer and the worker streams of one run; its books
    (metrics, totals, summary, verdict) are a RunBooks."""

    def __init__(self, settings: LearnerSettings, token: str) -> None:
        if settings.inference == "central" and settings.credits_per_worker != 1:
            # Every action comes from the newest weights, and one fragment in flight per
            # worker makes policy lag 0 or 1 by construction (see learner/central.py).
            log.info("central inference: 1 credit per worker (--credits-per-worker %d is for "
                     "worker inference), so policy lag is 0 or 1",
                     settings.credits_per_worker)
            settings = dataclasses.replace(settings, credits_per_worker=1)
        if settings.rank:
            # Rank 0 writes the run's outputs; the others keep their own books in
            # <out>/ranks/rank<N> (the same group figures, their own waits) and no more.
            settings = dataclasses.replace(settings, progress=False, eval_every=0,
                                           write_settings=False, track=False)
        self.settings = settings
        torch.set_num_threads(settings.learner_torch_threads)
        torch.manual_seed(settings.seed)
        self.device = resolve_device(settings.device, settings.rank)
        # A learner group's ranks train one policy on their own workers (learner/group.py).
        self.group = (LearnerGroup(settings.rank, settings.learners, settings.rendezvous,
                                   self.device, token=token)
                      if settings.learners > 1 else None)
        self.leader = self.group is None or self.group.leader
        addresses = (*settings.worker_addresses, *settings.own_worker_addresses)
        if self.group is not None:
            addresses = (*rank_addresses(settings.worker_addresses, settings.rank,
                                         settings.learners),
                         *settings.own_worker_addresses)
            if not addresses:
                raise ConfigError(f"learner rank {settings.rank} of {settings.learners} has no "
                                  "rollout workers to train on: give every rank one or more "
                                  "(--workers >= --learners; in a cluster, env hosts x "
                                  "--workers-per-env-host >= the learner ranks), or start "
                                  "fewer ranks")
        self._rank_workers = [len(addresses)]  # every rank's, once they have met
        self._group_workers = list(addresses)
        description = describe_env(settings)
        obs_space, act_space = description.observation_space, description.action_space
        self.policy = Policy(obs_space, act_space, settings).to(self.device)
        self.optimizer = PolicyAdam(self.policy, settings.learning_rate)
        self.version = 0
        self.out = Path(settings.out or default_run_dir(settings.env, settings.seed))
        self.checkpoint_dir = Path(settings.checkpoint_dir or self.out / "checkpoints")
        if not self.leader:
            self.out = self.out / "ranks" / f"rank{settings.rank}"
        resumed = self._resume() if settings.resume and self.leader else None
        if self.group is not None:
            resumed = self._share_start(resumed, addresses)
        self.spec = StreamSpec(
            env=settings.env,
            observation_space=str(obs_space),
            action_space=str(act_space),
            obs_layout=ObsLayout.of(obs_space),
            action_shape=action_shape(act_space),
            action_dtype=action_dtype(act_space),
            state_size=self.policy.state_size,
        )
        # Bounded in practice by the credits: each worker holds at most
        # credits_per_worker fragments in flight, plus one failure notice per stream.
        self.fan_in: queue.Queue = queue.Queue(
            maxsize=fan_in_bound(len(addresses), settings.credits_per_worker))
        # The last weights known to be finite: what a non-finite update is rolled back to.
        self._good_state = self._snapshot()
        weights = weights_message(self.version, self._good_state)
        self.inference = (InferenceServer(obs_space, act_space, settings, self.device,
                                          self._good_state, self.version)
                          if settings.inference == "central" else None)
        self.streams = [
            WorkerStream(address, token, self.spec, self.fan_in, weights,
                         settings.credits_per_worker, settings.connect_timeout,
                         options=transport_options(settings), nonfinite=settings.nonfinite,
                         inference=self.inference)
            for address in addresses
        ]
        self.publisher = Publisher(self.streams, self.device, inference=self.inference)
        stall = StallWatch(STALL_SECONDS)
        self.batcher = Batcher(
            self.fan_in, self.streams, self.device, target=self.fragments_per_batch,
            version=self.version,
            max_policy_lag=settings.max_policy_lag,
            budget_spent=lambda: self._estimated_step() >= settings.total_steps,
            return_credit=self.publisher.return_credit,
            stall=stall, on_lost=lambda failure: self.books.worker_lost(failure),
            # synchronous: no update while a fragment is out, so none spans two
            one_per_stream=self.inference is not None and not settings.synchronous,
            synchronous=settings.synchronous,
        )
        # The group's books (every rank's counts, summed at each turn) or the batcher's.
        self.tally = GroupBooks() if self.group is not None else None
        self.books = RunBooks(settings, self.out, self.streams, self.tally or self.batcher,
                              stall, UtilisationSampler(self.device))
        self.books.summary_extras = self._summary_extras
        if self.tally is not None:
            tally = self.tally
            self.books.verdict_note = lambda: lockstep_note(tally.lockstep_shares(),
                                                            self._rank_workers)
        if resumed is not None:
            path, step, totals = resumed
            if self.tally is not None:
                self.tally.restore(step)
            else:
                self.batcher.global_step = step
            self.books.restore(path, totals)
            if self.tally is not None:
                self.tally.rebase()
        # A group rank's own figures since it started, as its turns report them.
        self._episodes_told = 0
        self._steps_at_turn = 0
        self._lockstep_seconds = 0.0
        self._waited_before, self._trained_before = (self.books.wait_seconds,
                                                     self.books.train_seconds)
        self._checkpoint_agreed = False
        self._between_turns = True
        self._start_version = self.version
        self._rank_checksums: list[str] = []
        self._stop_reason: str | None = None
        self._stop_failed = False
        self._finishing = False
        self.evals = PeriodicEval(self.out, settings.eval_every, settings)
        # The best policy by training return (with --eval-every the evaluator keeps it).
        self.best = BestPolicy(self.out, enabled=self.leader and not settings.eval_every)
        # Room for a model, a checkpoint (weights, Adam's two moments) and a best policy,
        # twice over, whatever fills the disk (learner/reserve.py).
        weights = sum(v.numel() * v.element_size() for v in self.policy.state_dict().values())
        self.reserve = DiskReserve(self.out, 2 * 5 * weights + (1 << 20))

    def _summary_extras(self) -> dict[str, object]:
        extras: dict[str, object] = {"weights_publish_failures": self.publisher.failures}
        if self.inference is not None:
            extras.update(self.inference.stats())
        if self.group is not None and self.tally is not None:
            group, tally = self.group, self.tally
            extras["workers"] = self._group_workers  # every rank's, rank by rank
            extras["learner_group"] = {
                "ranks": group.ranks,
                "rank": group.rank,
                "backend": "nccl" if self.device.type == "cuda" else "gloo",
                "rank_workers": self._rank_workers,
                "rank_env_steps": tally.rank_steps,
                "rank_wait_seconds": [round(w, 3) for w in tally.rank_wait_seconds],
                "rank_lockstep_seconds": [round(w, 3) for w in tally.rank_lockstep_seconds],
                "rank_train_seconds": [round(t, 3) for t in tally.rank_train_seconds],
                "rank_wait_share": [round(w, 4) for w in tally.wait_shares()],
                "rank_lockstep_share": [round(w, 4) for w in tally.lockstep_shares()],
                "allreduce_seconds_per_update": round(
                    group.reduce_seconds / max(self.version - self._start_version, 1), 6),
                "allreduces_per_update": round(
                    group.reduces / max(self.version - self._start_version, 1), 2),
                "rank_weights_sha256": self._rank_checksums,
                "weights_identical": (len(set(self._rank_checksums)) == 1
                                      if self._rank_checksums else None),
                "broken": group.broken,
            }
        return extras

    @property
    def extra_metrics(self) -> Callable[[], dict[str, float]] | None:
        """Extra metrics from whoever runs the learner (e.g. env hosts' CPU in a cluster)."""
        return self.books.extra_metrics

    @extra_metrics.setter
    def extra_metrics(self, source: Callable[[], dict[str, float]] | None) -> None:
        self.books.extra_metrics = source

    @property
    def global_step(self) -> int:
        """Env steps so far; the batcher counts them as fragments arrive (a group's
        ranks: all ranks' steps as of the last turn, the same on every rank)."""
        return self.tally.global_step if self.tally is not None else self.batcher.global_step

    def _estimated_step(self) -> int:
        """The run's steps now as far as this rank knows: the group's at the last turn
        plus this rank's since (never more than the truth, so the budget is never
        declared spent early)."""
        if self.tally is None:
            return self.batcher.global_step
        return self.tally.global_step + self.batcher.global_step - self._steps_at_turn

    def fragments_per_batch(self) -> int:
        """--fragments-per-batch, or (auto) what keeps the policy lag near
        --target-policy-lag with the workers connected now (at least one counted, so a
        batch always has a size). Central inference, auto: one fragment from every worker
        not lost for good (connecting ones included), which with one credit each and one
        fragment per worker per batch makes policy lag 0 or 1. --synchronous: every
        credit of every worker not lost for good, so a batch never trains while a
        worker that will send into it is still connecting (lag 0, either inference)."""
        not_lost = sum(s.state is not StreamState.CLOSED for s in self.streams)
        if self.settings.synchronous:
            return self.settings.batch_fragments(not_lost)
        if self.inference is not None and self.settings.fragments_per_batch == "auto":
            return max(1, not_lost)
        connected = sum(s.state is StreamState.STREAMING for s in self.streams)
        if self.group is not None and self.settings.fragments_per_batch != "auto":
            # The group's batch is what --fragments-per-batch asks, each rank's part
            # in proportion to its workers.
            return rank_share(int(self.settings.fragments_per_batch), self.group.rank,
                              self._rank_workers)
        return self.settings.batch_fragments(connected)

    def _resume(self) -> tuple[str, int, dict] | None:
        """Load the newest checkpoint into the policy and optimizer; return its path, its
        global step and the run totals it carries (None if there is none)."""
        found = load_newest(self.checkpoint_dir)
        if found is None:
            log.info("no checkpoint in %s; starting fresh", self.checkpoint_dir)
            return None
        path, state = found
        saved_env = state.get("env")
        if saved_env is not None and saved_env != self.settings.env:
            raise ConfigError(f"--resume: the checkpoint {path} is of env {saved_env}, this "
                              f"run's is {self.settings.env}; resume with --env {saved_env}, "
                              "or point --checkpoint-dir / --out elsewhere")
        try:
            self.policy.load_state_dict(state["policy"])
        except RuntimeError as exc:  # shapes differ: another network or observation space
            first = str(exc).strip().splitlines()[-1].strip()
            raise ConfigError(f"--resume: the checkpoint {path} holds another network than "
                              f"these settings build ({first}); resume with the run's own "
                              "--hidden-sizes / --policy, or point --checkpoint-dir / --out "
                              "elsewhere") from exc
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["policy_version"])
        log.info("resumed from %s at step %d (policy version %d)",
                 path, int(state["global_step"]), self.version)
        return str(path), int(state["global_step"]), dict(state.get("totals") or {})

    def _share_start(self, resumed: tuple[str, int, dict] | None, addresses: Sequence[str]
                     ) -> tuple[str, int, dict] | None:
        """A group's start: rank 0's weights, optimizer state, version and books (fresh
        or resumed) on every rank, and every rank's workers (`addresses`: this one's);
        return what rank 0 resumed from."""
        assert self.group is not None
        mine = ({"path": resumed[0] if resumed else None, "step": resumed[1] if resumed else 0,
                 "totals": resumed[2] if resumed else {}, "version": self.version}
                if self.leader else {})
        turns = self.group.agree({**mine, "workers": list(addresses)})
        self._rank_workers = [len(t["workers"]) for t in turns]
        self._group_workers = [address for t in turns for address in t["workers"]]
        start = turns[0]
        self.group.broadcast_([*self.policy.state_dict().values(),
                               *optimizer_tensors(self.optimizer)])
        self.version = int(start["version"])
        return (start["path"], int(start["step"]), start["totals"]) if start["path"] else None

    def checkpoint(self) -> Path | None:
        """Write a checkpoint of the policy, optimizer and counters now (a group: rank 0
        writes it, with every rank's weights checksum; once the group broke, every
        surviving rank writes its own into rescue-rank<N>/, as rank 0 may have died)."""
        directory = self.checkpoint_dir
        if not self.leader:
            if self.group is None or self.group.broken is None or not self.version:
                return None
            directory = rescue_dir(self.checkpoint_dir, self.group.rank)
        state = {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "global_step": self.global_step,
            "policy_version": self.version,
            "env": self.settings.env,
            "totals": self.books.totals(),
        }
        if self.group is not None:
            state["rank_weights_sha256"] = list(self._rank_checksums)
        path = save_checkpoint(directory, self.global_step, state,
                               self.settings.keep_checkpoints)
        self._last_checkpoint = time.monotonic()
        return path

    @property
    def training(self) -> bool:
        """True until the learner begins to stop (nothing should restart workers then)."""
        return self._stop_reason is None and not self._finishing

    def request_stop(self, reason: str, failed: bool = False) -> None:
        """Stop training at the next batch (saving as always); the first reason given is
        the one recorded (a launcher's SIGTERM after the user's Ctrl-C does not rename
        the stop). `failed`: the run failed for that reason (exit code 1)."""
        if self._stop_reason is None:
            self._stop_reason = reason
            self._stop_failed = failed

    def _snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of the state dict on the device that later updates cannot change."""
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    # -- main loop -----------------------------------------------------------------
    def run(self) -> int:
        s = self.settings
        self.out.mkdir(parents=True, exist_ok=True)
        self.reserve.take()
        if s.write_settings:
            write_atomic(self.out / "settings.json", to_json(s).encode())
        metrics = self.books.open()
        if self.inference is not None:
            self.inference.start()
        for stream in self.streams:
            stream.start()
        self.batcher.start()
        self.publisher.start()
        self.books.stall.start()
        code, outcome = EXIT_OK, "finished"
        self._last_checkpoint = time.monotonic()
        try:
            while True:
                if self.group is not None:
                    ready = self._group_turn()
                elif self.global_step < s.total_steps and self._stop_reason is None:
                    ready = self._next_batch()
                else:
                    break
                if ready is None:
                    break
                try:
                    self._train(ready, metrics)
                finally:
                    self.batcher.release(ready)
                if self._checkpoint_due():
                    self._save_outputs(periodic=True)
            if self._stop_failed:
                outcome, code = f"failed: {self._stop_reason}", EXIT_FAILED
            elif self._stop_reason is not None:
                # A stop is a success once the model and checkpoint are saved below.
                outcome, code = f"stopped: {self._stop_reason}", EXIT_OK
        except HetrlError as exc:
            outcome, code = f"failed: {exc}", EXIT_FAILED
            log.error("%s", exc)
        finally:
            self._finishing = True
            self.books.training_ended_unix = time.time()
            self.books.stall.stop()
            if s.finishing_file:
                Path(s.finishing_file).touch()
            self.batcher.stop()
            self.publisher.close()
            if self.inference is not None:
                self.inference.close()
            self._last_turn()
            # The model and checkpoint first: no worker, hung or slow, can delay them.
            failed = self._save_outputs(periodic=False)
            not_stopped = self._stop_workers(outcome)
            try:
                self.books.write_summary(outcome, self.version, not_stopped,
                                         best=self.best.summary(),
                                         failure=self._stop_reason if self._stop_failed
                                         else None)
            except OutputError as exc:
                log.error("%s", exc)
                failed = True
            self.evals.final(self.policy, self.global_step)
            self.evals.forward(metrics)
            self.books.close()
            self.reserve.close()
            if self.group is not None:
                self.group.close()
        return EXIT_FAILED if failed else code

    # -- a learner group's turns ---------------------------------------------------
    def _turn(self, has_batch: bool, error: HetrlError | None = None) -> dict:
        """What this rank tells the others at a turn: has it a batch, does it stop (and
        why), its books so far (cumulative; returns: the new ones)."""
        step, episodes, returns = self.batcher.counts(self._episodes_told)
        self._episodes_told, self._steps_at_turn = episodes, step
        stop = str(error) if error is not None else self._stop_reason
        return {
            "batch": has_batch, "stop": stop,
            "failed": error is not None or (stop is not None and self._stop_failed),
            "steps": step, "episodes": episodes, "returns": returns,
            "dropped": self.batcher.dropped_lag,
            "lags": {str(k): v for k, v in self.batcher.lag_histogram.items()},
            "wait": self.books.wait_seconds - self._waited_before,
            "train": self.books.train_seconds - self._trained_before,
            "lockstep": self._lockstep_seconds,
            # Rank 0's clock decides when the group checkpoints.
            "checkpoint": self.leader and (time.monotonic() - self._last_checkpoint
                                           > self.settings.checkpoint_every),
            "sha": None,
        }

    def _group_turn(self) -> ReadyBatch | None:
        """Take this rank's next batch (unless it stops or the budget is spent), then
        agree with the other ranks: the batch to train on if every rank has one and
        none stops, else None (this rank then stops for the first stopping rank's
        reason).

        Raises:
            GroupError: a rank died or stopped answering.
            HetrlError: what this rank's batcher ran into (told to the others first).
        """
        assert self.group is not None and self.tally is not None
        ready, error = None, None
        # From here until the turn is taken, leaving (a bug's exception) skips the last
        # turn: the others then find this rank gone instead of a turn out of step.
        self._between_turns = False
        if self._stop_reason is None and self.global_step < self.settings.total_steps:
            try:
                ready = self._next_batch()
            except HetrlError as exc:
                error = exc
        start = time.perf_counter()
        try:
            turns = self.group.agree(self._turn(ready is not None, error))
        except GroupError:
            if ready is not None:
                self.batcher.release(ready)
            if error is not None:  # this rank's own cause, which its turn could not tell
                log.error("learner rank %d: %s", self.group.rank, error)
            raise
        self._lockstep_seconds += time.perf_counter() - start
        self.tally.fold(turns)
        self._checkpoint_agreed = bool(turns[0]["checkpoint"])
        stopping = [(rank, t) for rank, t in enumerate(turns) if t["stop"] is not None]
        if ready is not None and all(t["batch"] for t in turns) and not stopping:
            return ready
        self._between_turns = True  # the loop ends here on every rank
        if ready is not None:
            self.batcher.release(ready)
        if error is not None:
            raise error
        for rank, turn in stopping:
            if rank != self.group.rank:
                self.request_stop(f"learner rank {rank}: {turn['stop']}", failed=turn["failed"])
        return None

    def _checksum_turn(self, turn: dict) -> list[dict]:
        """Agree on `turn` with every rank's weights checksum in it; keep the checksums
        (for the checkpoint and the summary); return the turns."""
        assert self.group is not None and self.tally is not None
        turn["sha"] = weights_sha256(self.policy.state_dict())
        turns = self.group.agree(turn)
        self._rank_checksums = [t["sha"] for t in turns]
        if len(set(self._rank_checksums)) > 1:
            log.error("the learner ranks' weights differ (checksums %s): a bug in the "
                      "group's lockstep; the checkpoint is rank 0's", self._rank_checksums)
        return turns

    def _checkpoint_due(self) -> bool:
        """Time for a periodic checkpoint (a group: rank 0's clock, said at the turn;
        every rank then tells its weights checksum)."""
        if self.group is None:
            return time.monotonic() - self._last_checkpoint > self.settings.checkpoint_every
        if not self._checkpoint_agreed:
            return False
        self._checkpoint_agreed = False
        self._checksum_turn({})
        return True

    def _last_turn(self) -> None:
        """A group's last turn, when every rank ended its loop together: each rank's
        final books and weights checksum, for the summary and the final checkpoint.
        Skipped when the group broke or this rank left it in the middle of a turn or
        an update (the others find it gone)."""
        if self.group is None or self.group.broken is not None or not self._between_turns:
            return
        assert self.tally is not None
        leaving = sys.exc_info()[1]  # a bug's exception on its way out of run()
        if leaving is not None and self._stop_reason is None:
            # Said in the turn, so that the others stop too instead of ending "finished".
            self.request_stop(f"learner rank {self.group.rank} left its loop: "
                              f"{type(leaving).__name__}: {leaving}", failed=True)
        try:
            self.tally.fold(self._checksum_turn(self._turn(False)))
        except GroupError as exc:
            log.error("%s", exc)
        except KeyError as exc:  # another rank was in another turn: its books are its own
            log.error("the learner ranks' last turns were out of step (a turn without %s); "
                      "this rank's final books are its own", exc)

    def _save_outputs(self, periodic: bool) -> bool:
        """Write the model, then a checkpoint; True if either failed. A failure (a full
        disk) leaves the previous file of each in place and no temporary file. Training
        goes on after a periodic failure (the model on disk is then the last one that
        fitted); a failure at the end makes the run's exit code 1."""
        failed = False
        outputs: tuple[tuple[str, Callable[[], Path | None]], ...] = (
            ("model", self._save_model), ("checkpoint", self.checkpoint),
            ("best policy", self._save_best))
        if not self.leader:  # a group's outputs are rank 0's, but for a rescue
            broken = self.group is not None and self.group.broken is not None
            if periodic or not broken:
                self._last_checkpoint = time.monotonic()
                return failed
            outputs = (("rescue checkpoint", self.checkpoint),)
        for what, write in outputs:
            try:
                try:
                    path = write()
                except OutputError as exc:
                    # The reserve is for the final outputs: a periodic save that does not
                    # fit waits for the end, so nothing can fill the space meanwhile.
                    if periodic or not self.reserve.release():
                        raise
                    log.warning("%s; writing the %s into the space kept for it (metrics and "
                                "TensorBoard may have filled the disk)", exc, what)
                    path = write()
                if not periodic and path is not None:
                    log.info("%s %s written", what, path)
            except OutputError as exc:
                failed = True
                log.error("%s%s", exc, " Training goes on." if periodic else "")

        self._last_checkpoint = time.monotonic()
        return failed

    def _next_batch(self) -> ReadyBatch | None:
        """The next assembled batch; None when stopped or the budget is spent.

        Raises:
            ProtocolError, WorkerLostError: from the batcher (streams that failed).
        """
        wait_start = time.perf_counter()
        ready = None
        while ready is None and self._stop_reason is None:
            check_inference_alive(self.inference)
            self.publisher.check()
            ready = self.batcher.next(timeout=0.5)
            if ready is None and self.batcher.spent:
                break
        self.books.waited(time.perf_counter() - wait_start)
        return ready

    def _train(self, ready: ReadyBatch, metrics: MetricsWriter) -> None:
        s = self.settings
        train_start = time.perf_counter()
        if s.anneal_lr:
            frac = max(0.0, 1.0 - self.global_step / s.total_steps)
            self.optimizer.param_groups[0]["lr"] = frac * s.learning_rate
        finite = False
        try:
            # A group's update can break halfway (a rank dies in an all-reduce): the
            # outputs must then hold the last whole version, Adam's moments included.
            moments = ([t.clone() for t in optimizer_tensors(self.optimizer)]
                       if self.group is not None else [])
            try:
                device_stats = ppo_update_async(self.policy, self.optimizer, ready.batch, s,
                                                self.group)
            except GroupError:
                self.policy.load_state_dict(self._good_state)
                for tensor, before in zip(optimizer_tensors(self.optimizer), moments,
                                          strict=True):
                    tensor.copy_(before)
                raise
            self._between_turns = True
            floats = [p for p in self.policy.state_dict().values() if p.is_floating_point()]
            # One device reduction for the finite check, read with the statistics.
            device_stats["finite"] = torch.stack([torch.isfinite(p).all() for p in floats]).all()
            stats = read_stats(device_stats)  # the update's one host sync
            finite = bool(stats.pop("finite"))
            if finite:
                self.version += 1
                self._good_state = self._snapshot()
                self.publisher.offer(self.version, self._good_state)
                # One moment's step and returns for both the best policy and the row.
                progress = (self.tally or self.batcher).progress()
                self.best.offer(self._good_state, progress[1], progress[0], self.version)
        finally:
            # Credits held back for this update go out after its weights.
            for stream, generation in self.batcher.update_done(self.version):
                self.publisher.return_credit(stream, generation)
        if not finite:
            self._reject_nonfinite_update()
            return
        self.books.trained(ready, time.perf_counter() - train_start, stats, self.version,
                           self.optimizer.param_groups[0]["lr"], progress)
        self.evals.after_update(self.policy, self.global_step, metrics)

    def _reject_nonfinite_update(self) -> None:
        """An update produced NaN/Inf weights: never push or checkpoint them. Fail fast,
        or (--nonfinite drop) restore the last good weights, reset the optimizer's moments
        and count it."""
        self.books.rejected()
        message = (f"update {self.version + 1} produced NaN/Inf weights; lower "
                   "--learning-rate or --reward-scale, or check the env's rewards")
        self.policy.load_state_dict(self._good_state)
        if self.settings.nonfinite == "fail":
            raise NonFiniteError(message + " (--nonfinite fail)")
        log.error("%s; restored version %d and dropped the batch", message, self.version)
        self.optimizer.state.clear()

    # -- shutdown ------------------------------------------------------------------
    def _stop_workers(self, reason: str) -> list[str]:
        """Send Stop on every stream at once and wait at most FINAL_STOP_SECONDS for
        them to end; a stream still open then (a worker hung in its env, or frozen) is
        closed. Returns the addresses of the workers that did not stop in time."""
        stopped: dict[str, bool] = {}

        def stop(stream: WorkerStream) -> None:
            stopped[stream.address] = stream.stop(reason, FINAL_STOP_SECONDS)

        threads = [threading.Thread(target=stop, args=(stream,), daemon=True,
                                    name=f"stop-{stream.address}") for stream in self.streams]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + FINAL_STOP_SECONDS + 3.0  # + closing the channel
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        late = [stream.address for stream in self.streams if not stopped.get(stream.address)]
        if late:
            log.warning("workers %s did not end their streams within %.0f s of the Stop "
                        "(hung or frozen); their streams were closed", late,
                        FINAL_STOP_SECONDS)
        return late

    def _save_model(self) -> Path:
        data = safetensors_bytes(policy_arrays(self.policy), metadata={
            **self._model_metadata(),
            "policy_version": str(self.version),
            "global_step": str(self.global_step),
        })
        return write_atomic(self.out / "model.safetensors", data)

    def _save_best(self) -> Path | None:
        return self.best.write(self._model_metadata())

    def _model_metadata(self) -> dict[str, str]:
        # load_policy(run) needs nothing else
        return {**model_metadata(self.settings), "env": self.settings.env}


def stop_reason(signum: int) -> str:
    """How a stop by signal reads in the summary: SIGINT is the user's Ctrl-C."""
    name = signal.Signals(signum).name
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else f"signal {name}"


def run_learner(settings: LearnerSettings, token: str | None = None) -> int:
    """Train until done; return the process exit code. Signals stop it gracefully."""
    learner = Learner(settings, token or token_from_env())

    def on_signal(signum, _frame):
        cause = Path(settings.stop_reason_file) if settings.stop_reason_file else None
        if cause is not None and cause.exists():  # the launcher says why it stops us
            learner.request_stop(cause.read_text().strip(), failed=True)
        else:
            learner.request_stop(stop_reason(signum))

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    return learner.run()


def wait_for_addresses(path: Path) -> tuple[str, ...]:
    """The worker addresses a launcher writes to `path` once its workers listen. The
    launcher bounds this wait (--startup-timeout): it stops the learner when its workers
    do not start, and the learner dies with it (PR_SET_PDEATHSIG)."""
    while not path.exists():
        time.sleep(0.02)
    return tuple(json.loads(path.read_text())["addresses"])


def main(argv: list[str] | None = None) -> int:
    """`python -m hetrl.learner.learner SETTINGS_JSON`: the launcher's way to start a learner."""
    settings_file = start_child(argv)
    # A stop before training begins (the workers failed to start, Ctrl-C) ends quietly;
    # run_learner installs the handlers that save first.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: exit_now(EXIT_OK))
    try:
        settings = from_json(LearnerSettings, settings_file.read_text())
        if settings.addresses_file:  # started beside its workers: wait for them here
            # What building the learner imports (torch.optim imports torch._dynamo on
            # first use: 1.4 s here), imported while the workers start instead of after.
            import torch._dynamo  # noqa: F401
            from torch.utils import tensorboard  # noqa: F401

            addresses = wait_for_addresses(Path(settings.addresses_file))
            settings = dataclasses.replace(settings, worker_addresses=addresses)
        return run_learner(settings)
    except HetrlError as exc:
        log.error("%s", exc)
        return EXIT_FAILED


if __name__ == "__main__":
    exit_now(main())
