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
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save as safetensors_bytes

from hetrl.learner.batcher import Batcher, ReadyBatch
from hetrl.learner.checkpoint import load_latest, save_checkpoint, write_atomic
from hetrl.learner.connections import (
    StreamSpec,
    StreamState,
    WorkerStream,
    fan_in_bound,
    stream_counters,
)
from hetrl.learner.evaluation import PeriodicEval
from hetrl.learner.metrics import MetricsWriter, StallWatch
from hetrl.learner.ppo import ppo_update_async, read_stats
from hetrl.learner.publisher import Publisher, weights_message
from hetrl.learner.settings import LearnerSettings, auto_fragments_per_batch, default_run_dir
from hetrl.learner.utilisation import UtilisationSampler
from hetrl.learner.verdict import judge
from hetrl.rollout.envs import describe_env
from hetrl.rollout.errors import HetrlError, NonFiniteError, OutputError
from hetrl.rollout.evaluate import model_metadata
from hetrl.rollout.lifetime import die_with_parent
from hetrl.rollout.policy import Policy, action_dtype, policy_arrays
from hetrl.rollout.settings import to_json
from hetrl.rollout.transport import token_from_env, transport_options
from hetrl.rollout.userpath import user_modules_importable

log = logging.getLogger("hetrl.learner")

EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 0
# Seconds the final Stop waits for the workers' streams to end, after the model and the
# checkpoint are written; a worker that is hung in its env never answers it.
FINAL_STOP_SECONDS = 5.0
# Seconds without a fragment from any worker, while the learner waits, that count as a
# stall (warned as it happens, and told apart from a shortage in the verdict).
STALL_SECONDS = 10.0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Learner:
    """Owns the policy, the optimizer, the worker streams and the metrics of one run."""

    def __init__(self, settings: LearnerSettings, token: str) -> None:
        self.settings = settings
        torch.set_num_threads(settings.learner_torch_threads)
        torch.manual_seed(settings.seed)
        self.device = resolve_device(settings.device)
        description = describe_env(settings)
        obs_space, act_space = description.observation_space, description.action_space
        self.policy = Policy(obs_space, act_space, settings).to(self.device)
        # Fused Adam (one kernel for every parameter) on CUDA; the default elsewhere.
        fused = {"fused": True} if self.device.type == "cuda" else {}
        self.optimizer = torch.optim.Adam(
            self.policy.parameters(), lr=settings.learning_rate, eps=1e-5, **fused
        )
        self.version = 0
        self._updating = 0  # 1 while an update runs: the batch being built trains after it
        self.out = Path(settings.out or default_run_dir(settings.env, settings.seed))
        self.checkpoint_dir = Path(settings.checkpoint_dir or self.out / "checkpoints")
        self.resumed_from: str | None = None
        self._resumed_totals: dict = {}
        resumed_step = self._resume() if settings.resume else 0
        self.spec = StreamSpec(
            env=settings.env,
            observation_space=str(obs_space),
            action_space=str(act_space),
            obs_shape=tuple(obs_space.shape),
            obs_dtype=np.dtype(obs_space.dtype),
            action_shape=tuple(act_space.shape or ()),
            action_dtype=action_dtype(act_space),
        )
        # Bounded in practice by the credits: each worker holds at most
        # credits_per_worker fragments in flight, plus one failure notice per stream.
        self.fan_in: queue.Queue = queue.Queue(
            maxsize=fan_in_bound(len(settings.worker_addresses), settings.credits_per_worker))
        # The last weights known to be finite: what a non-finite update is rolled back to.
        self._good_state = self._snapshot()
        weights = weights_message(self.version, self._good_state)
        self.streams = [
            WorkerStream(address, token, self.spec, self.fan_in, weights,
                         settings.credits_per_worker, settings.connect_timeout,
                         options=transport_options(settings), nonfinite=settings.nonfinite)
            for address in settings.worker_addresses
        ]
        self.publisher = Publisher(self.streams, self.device)
        self.workers_lost: list[dict] = []
        self.stall = StallWatch(STALL_SECONDS)
        self.batcher = Batcher(
            self.fan_in, self.streams, self.device, target=self.fragments_per_batch,
            train_version=lambda: self.version + self._updating,
            max_policy_lag=settings.max_policy_lag,
            budget_spent=lambda: self.global_step >= settings.total_steps,
            return_credit=self.publisher.return_credit,
            stall=self.stall, on_lost=self._note_lost,
        )
        self.batcher.global_step = resumed_step
        self.wait_seconds = 0.0
        self.train_seconds = 0.0
        self.batch_wait_seconds = 0.0
        self.worker_collect_seconds = 0.0
        self.worker_wait_seconds = 0.0
        self.sampler = UtilisationSampler(self.device)
        # Extra metrics from whoever runs the learner (e.g. env hosts' CPU in a cluster).
        self.extra_metrics: Callable[[], dict[str, float]] | None = None
        self._stop_reason: str | None = None
        self.updates_nonfinite = 0
        self.evals = PeriodicEval(self.out, settings.eval_every, settings)
        # What the runs this one resumes counted, so that the summary, metrics and
        # report are cumulative and true across resumes.
        self.start_step = self.global_step
        self.wall_before = 0.0
        self.runs = 1
        self.counters_before: dict[str, int] = {}
        self.stall_before = 0.0
        self._session_start: float | None = None
        self._restore_totals(self._resumed_totals)

    # The run's counters live with the batcher, which keeps them as fragments arrive.
    @property
    def global_step(self) -> int:
        return self.batcher.global_step

    @property
    def episodes(self) -> int:
        return self.batcher.episodes

    @property
    def dropped_lag(self) -> int:
        return self.batcher.dropped_lag

    @property
    def lag_histogram(self):
        return self.batcher.lag_histogram

    @property
    def recent_returns(self):
        return self.batcher.recent_returns

    def fragments_per_batch(self) -> int:
        """--fragments-per-batch, or (auto) what keeps the policy lag near 2 with the
        workers connected now (at least one counted, so a batch always has a size)."""
        chosen = self.settings.fragments_per_batch
        if chosen != "auto":
            return int(chosen)
        connected = sum(s.state is StreamState.STREAMING for s in self.streams)
        return auto_fragments_per_batch(connected, self.settings.credits_per_worker)

    def _resume(self) -> int:
        """Load the newest checkpoint; return its global step (0 if there is none)."""
        found = load_latest(self.checkpoint_dir)
        if found is None:
            log.info("no checkpoint in %s; starting fresh", self.checkpoint_dir)
            return 0
        path, state = found
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["policy_version"])
        self.resumed_from = str(path)
        self._resumed_totals = dict(state.get("totals") or {})
        log.info("resumed from %s at step %d (policy version %d)",
                 path, int(state["global_step"]), self.version)
        return int(state["global_step"])

    def checkpoint(self) -> Path:
        """Write a checkpoint of the policy, optimizer and counters now."""
        state = {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "global_step": self.global_step,
            "policy_version": self.version,
            "env": self.settings.env,
            "totals": self._totals(),
        }
        path = save_checkpoint(self.checkpoint_dir, self.global_step, state,
                               self.settings.keep_checkpoints)
        self._last_checkpoint = time.monotonic()
        return path

    def _counters(self) -> dict[str, int]:
        """Stream counters of the whole run: this process's plus the resumed runs'."""
        now = stream_counters(self.streams)
        return {k: v + int(self.counters_before.get(k, 0)) for k, v in now.items()}

    def _totals(self) -> dict:
        """Run totals a checkpoint carries, for a resumed run to continue from."""
        session = (time.monotonic() - self._session_start
                   if self._session_start is not None else 0.0)
        return {
            "runs": self.runs,
            "wall_seconds": self.wall_before + session,
            "episodes": self.episodes,
            "recent_returns": [float(r) for r in self.recent_returns],
            "dropped_lag": self.dropped_lag,
            "updates_nonfinite": self.updates_nonfinite,
            "lag_histogram": {int(k): int(v) for k, v in self.lag_histogram.items()},
            "learner_wait_seconds": self.wait_seconds,
            "learner_train_seconds": self.train_seconds,
            "worker_collect_seconds": self.worker_collect_seconds,
            "worker_wait_seconds": self.worker_wait_seconds,
            "counters": self._counters(),
            "stalled_seconds": self.stall_before + self.stall.stalled_seconds,
        }

    def _restore_totals(self, totals: dict) -> None:
        """Continue the books of the runs this one resumes (the batcher keeps the
        per-fragment ones)."""
        if not totals:
            return
        books = self.batcher
        self.runs = int(totals.get("runs", 1)) + 1
        self.wall_before = float(totals.get("wall_seconds", 0.0))
        books.episodes = int(totals.get("episodes", 0))
        books.recent_returns.extend(totals.get("recent_returns", []))
        books.dropped_lag = int(totals.get("dropped_lag", 0))
        books.lag_histogram.update({int(k): int(v)
                                    for k, v in totals.get("lag_histogram", {}).items()})
        self.updates_nonfinite = int(totals.get("updates_nonfinite", 0))
        self.wait_seconds = float(totals.get("learner_wait_seconds", 0.0))
        self.train_seconds = float(totals.get("learner_train_seconds", 0.0))
        self.worker_collect_seconds = float(totals.get("worker_collect_seconds", 0.0))
        self.worker_wait_seconds = float(totals.get("worker_wait_seconds", 0.0))
        self.counters_before = dict(totals.get("counters", {}))
        self.stall_before = float(totals.get("stalled_seconds", 0.0))

    def _note_lost(self, failure) -> None:
        """Record a worker lost for good (its stream gave up), with the fragments it held
        credits for: sampled or being sampled, never received (called by the batcher)."""
        stream = next((st for st in self.streams if st.address == failure.address), None)
        in_flight = max(0, stream.in_flight) if stream is not None else 0
        hello = stream.hello if stream is not None else None
        self.workers_lost.append({
            "address": failure.address,
            "worker_id": hello.worker_id if hello is not None else None,
            "fragments_in_flight": in_flight,
            "global_step": self.global_step,
            "reason": str(failure.error)[:500],
        })

    def request_stop(self, reason: str) -> None:
        self._stop_reason = reason

    def _snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of the state dict on the device that later updates cannot change."""
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    # -- main loop -----------------------------------------------------------------
    def run(self) -> int:
        s = self.settings
        self.out.mkdir(parents=True, exist_ok=True)
        write_atomic(self.out / "settings.json", to_json(s).encode())
        track = ({"project": s.wandb_project, "entity": s.wandb_entity, "name": self.out.name}
                 if s.track else None)
        metrics = MetricsWriter(self.out, progress=s.progress, wall_offset=self.wall_before,
                                settings=dataclasses.asdict(s), track=track)
        self._session_start = time.monotonic()
        for stream in self.streams:
            stream.start()
        self.batcher.start()
        self.publisher.start()
        code, outcome = EXIT_OK, "finished"
        self._last_checkpoint = time.monotonic()
        try:
            while self.global_step < s.total_steps and self._stop_reason is None:
                ready = self._next_batch()
                if ready is None:
                    break
                try:
                    self._train(ready, metrics)
                finally:
                    self.batcher.release(ready)
                if time.monotonic() - self._last_checkpoint > s.checkpoint_every:
                    self._save_outputs(periodic=True)
            if self._stop_reason is not None:
                outcome, code = f"stopped: {self._stop_reason}", EXIT_INTERRUPTED
        except HetrlError as exc:
            outcome, code = f"failed: {exc}", EXIT_ERROR
            log.error("%s", exc)
        finally:
            if s.finishing_file:
                Path(s.finishing_file).touch()
            self.batcher.stop()
            self.publisher.close()
            # The model and checkpoint first: no worker, hung or slow, can delay them.
            failed = self._save_outputs(periodic=False)
            not_stopped = self._stop_workers(outcome)
            try:
                self._write_summary(outcome, metrics, not_stopped)
            except OutputError as exc:
                log.error("%s", exc)
                failed = True
            self.evals.final(self.policy, self.global_step)
            self.evals.forward(metrics)
            metrics.final({"mean_return_100": float(np.mean(self.recent_returns))
                           if self.recent_returns else None,
                           "global_step": self.global_step})
            metrics.close()
        return EXIT_ERROR if failed else code

    def _save_outputs(self, periodic: bool) -> bool:
        """Write the model, then a checkpoint; True if either failed. A failure (a full
        disk) leaves the previous file of each in place and no temporary file. Training
        goes on after a periodic failure (the model on disk is then the last one that
        fitted); a failure at the end makes the run's exit code 1."""
        failed = False
        for what, write in (("model", self._save_model), ("checkpoint", self.checkpoint)):
            try:
                path = write()
                if not periodic:
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
            ready = self.batcher.next(timeout=0.5)
            if ready is None and self.batcher.spent:
                break
        self.batch_wait_seconds = time.perf_counter() - wait_start
        self.wait_seconds += self.batch_wait_seconds
        return ready

    def _train(self, ready: ReadyBatch, metrics: MetricsWriter) -> None:
        s = self.settings
        train_start = time.perf_counter()
        if s.anneal_lr:
            frac = max(0.0, 1.0 - self.global_step / s.total_steps)
            self.optimizer.param_groups[0]["lr"] = frac * s.learning_rate
        self._updating = 1
        self.batcher.begin_update()
        finite = False
        try:
            device_stats = ppo_update_async(self.policy, self.optimizer, ready.batch, s)
            floats = [p for p in self.policy.state_dict().values() if p.is_floating_point()]
            # One device reduction for the finite check, read with the statistics.
            device_stats["finite"] = torch.stack([torch.isfinite(p).all() for p in floats]).all()
            stats = read_stats(device_stats)  # the update's one host sync
            finite = bool(stats.pop("finite"))
            if finite:
                self.version += 1
                self._good_state = self._snapshot()
                self.publisher.offer(self.version, self._good_state)
        finally:
            self._updating = 0
            # Credits held back during the update go out after its weights.
            for stream, generation in self.batcher.end_update():
                self.publisher.return_credit(stream, generation)
        if not finite:
            self._reject_nonfinite_update()
            return
        train_seconds = time.perf_counter() - train_start
        self.train_seconds += train_seconds
        infos = ready.infos
        collect = sum(f.collect_seconds for f in infos)
        waited = sum(f.wait_seconds for f in infos)
        self.worker_collect_seconds += collect
        self.worker_wait_seconds += waited

        lags = [self.version - 1 - f.policy_version for f in infos]
        busy = self.wait_seconds + self.train_seconds
        stats.update({
            # This process's rate: steps of a resumed run were made by an earlier one.
            "charts/SPS": (self.global_step - self.start_step)
            / max(metrics.session_seconds, 1e-9),
            "charts/learning_rate": self.optimizer.param_groups[0]["lr"],
            "charts/policy_version": float(self.version),
            "charts/policy_lag": float(np.mean(lags)),
            "charts/policy_lag_max": float(np.max(lags)),
            "charts/fragments_dropped_lag": float(self.dropped_lag),
            "charts/fragments_per_batch": float(len(infos)),
            "charts/episodes": float(self.episodes),
            "charts/learner_wait_fraction": self.wait_seconds / max(busy, 1e-9),
            "charts/worker_wait_seconds": float(np.mean([f.wait_seconds for f in infos])),
            "utilisation/learner_busy_fraction":
                train_seconds / max(train_seconds + self.batch_wait_seconds, 1e-9),
            "utilisation/worker_busy_fraction": collect / max(collect + waited, 1e-9),
            **self.sampler.sample(),
        })
        if self.extra_metrics is not None:
            stats.update(self.extra_metrics())
        if len(ready.episode_returns):
            stats["charts/episodic_return"] = float(ready.episode_returns.mean())
            stats["charts/episodic_length"] = float(ready.episode_lengths.mean())
        if self.recent_returns:
            stats["charts/mean_return_100"] = float(np.mean(self.recent_returns))
        metrics.log(self.global_step, stats)
        self.evals.after_update(self.policy, self.global_step, metrics)
        metrics.progress(self.global_step, self.settings.total_steps, stats["charts/SPS"],
                         self._progress_fields(stats))

    def _reject_nonfinite_update(self) -> None:
        """An update produced NaN/Inf weights: never push or checkpoint them. Fail fast,
        or (--nonfinite drop) restore the last good weights, reset the optimizer's moments
        and count it."""
        self.updates_nonfinite += 1
        message = (f"update {self.version + 1} produced NaN/Inf weights; lower "
                   "--learning-rate or --reward-scale, or check the env's rewards")
        self.policy.load_state_dict(self._good_state)
        if self.settings.nonfinite == "fail":
            raise NonFiniteError(message + " (--nonfinite fail)")
        log.error("%s; restored version %d and dropped the batch", message, self.version)
        self.optimizer.state.clear()

    def _progress_fields(self, stats: dict[str, float]) -> dict[str, str]:
        mean = stats.get("charts/mean_return_100", float("nan"))
        return {"return(100)": f"{mean:.1f}", "lag": f"{stats['charts/policy_lag']:.1f}",
                "dropped": str(self.dropped_lag)}

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
            **model_metadata(self.settings),  # load_policy(run) needs nothing else
            "env": self.settings.env,
            "policy_version": str(self.version),
            "global_step": str(self.global_step),
        })
        return write_atomic(self.out / "model.safetensors", data)

    def _write_summary(self, outcome: str, metrics: MetricsWriter,
                       not_stopped: list[str]) -> None:
        stalled = self.stall_before + self.stall.stalled_seconds
        summary = {
            "outcome": outcome,
            "env": self.settings.env,
            "global_step": self.global_step,
            "policy_version": self.version,
            "wall_seconds": round(metrics.wall_seconds, 2),
            "wall_seconds_this_run": round(metrics.session_seconds, 2),
            "runs": self.runs,
            "episodes": self.episodes,
            "mean_return_100": float(np.mean(self.recent_returns)) if self.recent_returns else None,
            "fragments_dropped_lag": self.dropped_lag,
            **self._counters(),
            "updates_nonfinite": self.updates_nonfinite,
            "policy_lag_histogram": {str(k): v for k, v in sorted(self.lag_histogram.items())},
            "learner_wait_seconds": round(self.wait_seconds, 3),
            "learner_train_seconds": round(self.train_seconds, 3),
            "workers": [s.address for s in self.streams],
            "resumed_from": self.resumed_from,
            "worker_collect_seconds": round(self.worker_collect_seconds, 3),
            "worker_wait_seconds": round(self.worker_wait_seconds, 3),
            "workers_not_stopped": not_stopped,
            "workers_lost": self.workers_lost,
            "stalled_seconds": round(stalled, 2),
            "fragments_lost_in_flight": sum(w["fragments_in_flight"]
                                            for w in self.workers_lost),
        }
        hosts = {address.rsplit(":", 1)[0] for address in summary["workers"]}
        verdict = judge(self.wait_seconds, self.train_seconds, self.worker_collect_seconds,
                        self.worker_wait_seconds, len(self.streams), len(hosts),
                        stalled_seconds=stalled)
        summary["verdict"] = verdict.kind
        summary["verdict_text"] = verdict.text
        write_atomic(self.out / "summary.json", json.dumps(summary, indent=2).encode())
        log.info("%s: %s steps in %.1f s, mean return(100) %s", outcome,
                 f"{self.global_step:,}", metrics.wall_seconds, summary["mean_return_100"])
        log.info("bottleneck: %s", verdict.text)


def run_learner(settings: LearnerSettings, token: str | None = None) -> int:
    """Train until done; return the process exit code. Signals stop it gracefully."""
    learner = Learner(settings, token or token_from_env())

    def on_signal(signum, _frame):
        learner.request_stop(f"signal {signal.Signals(signum).name}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    return learner.run()


def main(argv: list[str] | None = None) -> int:
    """`python -m hetrl.learner.learner SETTINGS_JSON`: the launcher's way to start a learner."""
    die_with_parent()  # first: no child outlives its launcher
    user_modules_importable()  # after hetrl: the user's --env / --policy modules
    import sys

    from hetrl.rollout.settings import from_json

    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return run_learner(from_json(LearnerSettings, Path(argv[0]).read_text()))
    except HetrlError as exc:
        log.error("%s", exc)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
