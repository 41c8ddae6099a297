"""The run's books and where they go: TensorBoard events, a JSONL file, a live progress
line, and summary.json with the verdict at the end.

`RunBooks` keeps the totals of a run (across resumes: a checkpoint carries them),
turns each update into its metrics and writes the summary and the bottleneck verdict,
so the learner's loop only tells it what happened. Metric names follow CleanRL
(`charts/episodic_return`, `charts/SPS`, `losses/...`) so curves compare with published
ones. Every record in metrics.jsonl carries `global_step` and `wall_seconds`. Metrics
are worth less than the run: a sink that fails to write (a full disk) is dropped with
one warning naming its path, and training goes on. Nothing here decides anything about
training, and nothing here imports torch at import time (the launcher reads
TRACK_NEEDS from here without it). Longer than most modules: it is all the books.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from hetrl.learner.connections import stream_counters
from hetrl.learner.rows import Rows
from hetrl.learner.stalls import StallWatch
from hetrl.learner.verdict import judge
from hetrl.rollout.errors import ConfigError

if TYPE_CHECKING:
    from hetrl.learner.batcher import Batcher, ReadyBatch
    from hetrl.learner.connections import StreamFailure
    from hetrl.learner.group import GroupBooks
    from hetrl.learner.settings import LearnerSettings
    from hetrl.learner.utilisation import UtilisationSampler

log = logging.getLogger("hetrl.metrics")
_learner_log = logging.getLogger("hetrl.learner")  # the run's outcome is the learner's news

PROGRESS_LINE_AGE = 20.0  # off a terminal, a progress line every run-age / 20 ...
PROGRESS_LINE_MAX = 300.0  # ... seconds, at most this far apart

TRACK_NEEDS = ("--track logs to Weights & Biases: pip install 'hetrl[track]' (and wandb "
               "login, or WANDB_MODE=offline)")


class MetricsWriter:
    """Append-only metrics sink for one run directory."""

    def __init__(self, out_dir: Path, progress: bool = True, progress_every: float = 2.0,
                 wall_offset: float = 0.0, settings: dict | None = None,
                 track: dict | None = None, resume_step: int | None = None) -> None:
        """Args:
            settings: the run's settings, written to TensorBoard as text and hparams.
            track: Weights & Biases project/entity/name (CleanRL's --track): the run's
                TensorBoard scalars are mirrored there (wandb's sync_tensorboard).
            resume_step: the step of the checkpoint a resumed run continues from: rows of
                metrics.jsonl past it are cut and TensorBoard's events past it purged.
        """
        from torch.utils.tensorboard import SummaryWriter  # heavy import, learner only

        out_dir.mkdir(parents=True, exist_ok=True)
        self._settings = dict(settings or {})
        self._wandb = _start_wandb(track, self._settings, out_dir) if track else None
        self._jsonl_path, self._tb_path = out_dir / "metrics.jsonl", out_dir / "tb"
        if resume_step is not None:
            try:
                _cut_after(self._jsonl_path, resume_step)
            except OSError as exc:  # a full disk: the rows stay, training goes on
                log.warning("cannot cut %s back to step %s (%s); rows past it stay",
                            self._jsonl_path, f"{resume_step:,}", exc)
        self._jsonl = None
        self._tb = None
        try:
            self._jsonl = self._jsonl_path.open("a", buffering=1)
        except OSError as exc:
            self._give_up("_jsonl", self._jsonl_path, exc)
        try:
            self._tb = SummaryWriter(str(self._tb_path), purge_step=(
                None if resume_step is None else resume_step + 1))
            _quiet_tensorboard_thread()
            if self._settings:
                self._tb.add_text("settings", _markdown_table(self._settings))
        except Exception as exc:
            self._give_up("_tb", self._tb_path, exc)
        self._start = time.monotonic()
        self._wall_offset = wall_offset  # wall seconds of the runs this one resumes
        self._progress = progress and sys.stderr is not None
        self._progress_every = progress_every
        self._last_progress = 0.0
        self._tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self._bar: tqdm | None = None  # on a terminal, made at the first progress call
        self._redirect: Any = None  # logging through tqdm.write while the bar shows

    def _give_up(self, sink: str, path: Path, exc: BaseException) -> None:
        """Drop one sink for the rest of the run, with one warning."""
        log.warning("cannot write metrics to %s (%s: %s); they are no longer written there, "
                    "training goes on", path, type(exc).__name__, exc)
        handle = getattr(self, sink)
        setattr(self, sink, None)
        try:
            if handle is not None:
                handle.close()
        except Exception:  # the same failure again, on the way out
            log.debug("closing the failed metrics sink raised", exc_info=True)

    @property
    def wall_seconds(self) -> float:
        """Wall seconds of the whole run, across resumes (as metrics.jsonl records it)."""
        return self._wall_offset + self.session_seconds

    @property
    def session_seconds(self) -> float:
        """Wall seconds since this process started writing."""
        return time.monotonic() - self._start

    def log(self, step: int, values: dict[str, float]) -> None:
        record = {"global_step": step, "wall_seconds": round(self.wall_seconds, 3)}
        for key, value in values.items():
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            record[key] = value
        if self._tb is not None:
            try:  # TensorBoard writes in a thread; its failure surfaces on the next call
                for key, value in record.items():
                    if key not in ("global_step", "wall_seconds"):
                        self._tb.add_scalar(key, value, step)
            except Exception as exc:
                self._give_up("_tb", self._tb_path, exc)
        if self._jsonl is not None:
            try:
                self._jsonl.write(json.dumps(record) + "\n")
            except OSError as exc:
                self._give_up("_jsonl", self._jsonl_path, exc)

    def progress(self, step: int, total: int, rate: float, fields: dict[str, str]) -> None:
        """Show progress: a tqdm bar (percent, steps/s, ETA, `fields`) on a terminal, a
        line every few seconds with the same figures otherwise (logs, CI)."""
        if not self._progress:
            return
        if self._tty:
            if self._bar is None:
                self._bar = tqdm(total=total, initial=0, unit="step", unit_scale=True,
                                 dynamic_ncols=True, file=sys.stderr, smoothing=0.1)
                # Log lines go above the bar, never glued to it.
                self._redirect = logging_redirect_tqdm()
                self._redirect.__enter__()
            self._bar.update(max(0, min(step, total) - self._bar.n))
            self._bar.set_postfix(fields, refresh=False)
            return
        now = time.monotonic()
        # A line every 2 s at first, then sparser as the run grows old (a twentieth of
        # its age, at most every 5 min): a day-long job's log gets ~350 of them.
        every = min(PROGRESS_LINE_MAX, max(self._progress_every,
                                           (now - self._start) / PROGRESS_LINE_AGE))
        if now - self._last_progress < every:
            return
        self._last_progress = now
        eta = (total - step) / rate if rate > 0 and step < total else 0.0
        extra = " | ".join(f"{k} {v}" for k, v in fields.items())
        sys.stderr.write(f"step {step:>10,}/{total:,} ({min(step / total, 1):5.1%}) | "
                         f"{rate:>7,.0f} SPS | ETA {_clock(eta)} | {extra}\n")
        sys.stderr.flush()

    def final(self, values: dict[str, float | None]) -> None:
        """The run's settings against its final figures, as TensorBoard hparams (None:
        a figure the run does not have, left out)."""
        if self._tb is None or not self._settings:
            return
        metrics = {f"hparams/{k}": float(v) for k, v in values.items() if v is not None}
        try:
            self._tb.add_hparams(_hparams(self._settings), metrics, run_name=".")
        except Exception as exc:
            self._give_up("_tb", self._tb_path, exc)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            if self._redirect is not None:
                self._redirect.__exit__(None, None, None)
        if self._wandb is not None:
            self._wandb.finish()
        for sink, path in (("_tb", self._tb_path), ("_jsonl", self._jsonl_path)):
            handle = getattr(self, sink)
            if handle is None:
                continue
            try:
                handle.close()
            except Exception as exc:
                self._give_up(sink, path, exc)


class RunBooks:
    """The books of one run: totals, the metrics of each update, the summary and verdict.

    The learner tells it what happened (`waited`, `trained`, `rejected`, `worker_lost`);
    the per-fragment counts (steps, episodes, lag) it reads from the batcher, the fault
    counters from the streams. Totals of the runs this one resumes come in through
    `restore` and go out through `totals`, so that the summary, the metrics and the
    report are cumulative and true across resumes. Lifecycle: `open` (the metrics
    sinks), then updates, then `write_summary` and `close`."""

    def __init__(self, settings: LearnerSettings, out: Path, streams: Sequence,
                 batcher: Batcher | GroupBooks, stall: StallWatch,
                 sampler: UtilisationSampler) -> None:
        self.settings, self.out = settings, out
        self.streams, self.batcher, self.stall, self.sampler = streams, batcher, stall, sampler
        self.metrics: MetricsWriter | None = None
        # Extra metrics from whoever runs the learner (e.g. env hosts' CPU in a cluster).
        self.extra_metrics: Callable[[], dict[str, float]] | None = None
        self.summary_extras: Callable[[], dict[str, object]] | None = None
        self.verdict_note: Callable[[], str | None] | None = None
        """A sentence the learner adds to the verdict (a learner group's lockstep cost)."""
        """More summary fields from the learner (central inference's passes and rows)."""
        self.rows = Rows(settings.metrics_every)
        self.version = 0
        self.wait_seconds = 0.0  # the learner waiting for a batch, summed
        self.train_seconds = 0.0  # the learner updating, summed
        self.batch_wait_seconds = 0.0  # the wait for the latest batch
        self.worker_collect_seconds = 0.0
        self.worker_wait_seconds = 0.0
        self.updates_nonfinite = 0
        self.workers_lost: list[dict] = []
        # What the runs this one resumes counted (`restore`).
        self.resumed_from: str | None = None
        self.start_step = batcher.global_step
        self.runs = 1
        self.wall_before = 0.0
        self.counters_before: dict[str, int] = {}
        self.stall_before = 0.0
        self._session_start: float | None = None
        # Clock times (Unix seconds) a launcher reads to split its command's wall time
        # into start-up (until the first update), training and stop.
        self.opened_unix: float | None = None
        self.first_update_unix: float | None = None
        self.training_ended_unix: float | None = None  # before the final saves and stop

    # -- across resumes ----------------------------------------------------------
    def restore(self, checkpoint: str, totals: dict) -> None:
        """Continue the books of the runs this one resumes from `checkpoint` (its `totals`;
        the batcher, already at the checkpoint's step, keeps the per-fragment ones)."""
        self.resumed_from = checkpoint
        self.start_step = self.batcher.global_step
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

    def totals(self) -> dict:
        """Run totals a checkpoint carries, for a resumed run to continue from."""
        session = (time.monotonic() - self._session_start
                   if self._session_start is not None else 0.0)
        books = self.batcher
        return {
            "runs": self.runs,
            "wall_seconds": self.wall_before + session,
            "episodes": books.episodes,
            "recent_returns": [float(r) for r in books.recent_returns],
            "dropped_lag": books.dropped_lag,
            "updates_nonfinite": self.updates_nonfinite,
            "lag_histogram": {int(k): int(v) for k, v in books.lag_histogram.items()},
            "learner_wait_seconds": self.wait_seconds,
            "learner_train_seconds": self.train_seconds,
            "worker_collect_seconds": self.worker_collect_seconds,
            "worker_wait_seconds": self.worker_wait_seconds,
            "counters": self.counters(),
            "stalled_seconds": self.stalled_seconds,
        }

    def counters(self) -> dict[str, int]:
        """Stream counters of the whole run: this process's plus the resumed runs'."""
        now = stream_counters(self.streams)
        return {k: v + int(self.counters_before.get(k, 0)) for k, v in now.items()}

    @property
    def stalled_seconds(self) -> float:
        return self.stall_before + self.stall.stalled_seconds

    @property
    def mean_return_100(self) -> float | None:
        returns = self.batcher.recent_returns
        return float(np.mean(returns)) if returns else None

    # -- during the run ----------------------------------------------------------
    def open(self) -> MetricsWriter:
        """Open the metrics sinks; the run's wall clock starts now."""
        s = self.settings
        track = ({"project": s.wandb_project, "entity": s.wandb_entity, "name": self.out.name}
                 if s.track else None)
        # A resumed run continues its metrics from the checkpoint: rows written after it
        # by the run that died are dropped, so no step appears twice.
        resume_step = self.start_step if self.resumed_from else None
        self.metrics = MetricsWriter(self.out, progress=s.progress, wall_offset=self.wall_before,
                                     settings=dataclasses.asdict(s), track=track,
                                     resume_step=resume_step)
        self._session_start = time.monotonic()
        self.opened_unix = time.time()
        return self.metrics

    def waited(self, seconds: float) -> None:
        """The learner waited `seconds` for its next batch."""
        self.batch_wait_seconds = seconds
        self.wait_seconds += seconds

    def rejected(self) -> None:
        """An update made NaN/Inf weights and was rolled back."""
        self.updates_nonfinite += 1

    def worker_lost(self, failure: StreamFailure) -> None:
        """Record a worker lost for good (its stream gave up), with the fragments it held
        credits for: sampled or being sampled, never received (called by the batcher)."""
        stream = next((st for st in self.streams if st.address == failure.address), None)
        in_flight = max(0, stream.in_flight) if stream is not None else 0
        hello = stream.hello if stream is not None else None
        self.workers_lost.append({
            "address": failure.address,
            "worker_id": hello.worker_id if hello is not None else None,
            "fragments_in_flight": in_flight,
            "global_step": self.batcher.global_step,
            "reason": str(failure.error)[:500],
        })

    def trained(self, ready: ReadyBatch, train_seconds: float, stats: dict[str, float],
                version: int, learning_rate: float,
                progress: tuple[int, Sequence[float]] | None = None) -> None:
        """Log an update that made `version` from `ready` in `train_seconds`: its loss
        `stats`, then the run's rates, lag, busy fractions and returns; show progress.
        `progress`: the (global step, last returns) to log, as the best policy saw them;
        None: the batcher's now."""
        assert self.metrics is not None, "open() first"
        books, metrics = self.batcher, self.metrics
        step, returns = progress if progress is not None else books.progress()
        if self.first_update_unix is None:
            self.first_update_unix = time.time()
        self.train_seconds += train_seconds
        infos = ready.infos
        collect = sum(f.collect_seconds for f in infos)
        waited = sum(f.wait_seconds for f in infos)
        self.worker_collect_seconds += collect
        self.worker_wait_seconds += waited
        lags = [version - 1 - f.policy_version for f in infos]
        self.rows.add({
            **stats,
            "charts/learning_rate": learning_rate,
            "charts/worker_wait_seconds": float(np.mean([f.wait_seconds for f in infos])),
            "utilisation/learner_busy_fraction":
                train_seconds / max(train_seconds + self.batch_wait_seconds, 1e-9),
            "utilisation/worker_busy_fraction": collect / max(collect + waited, 1e-9),
        }, lags, ready.episode_returns, ready.episode_lengths)
        self.version = version
        # This process's rate: steps of a resumed run were made by an earlier one.
        sps = (step - self.start_step) / max(metrics.session_seconds, 1e-9)
        if self.rows.due(time.monotonic()):
            self._write_row(sps, step, returns)
        mean = float(np.mean(returns)) if returns else float("nan")
        metrics.progress(step, self.settings.total_steps, sps, {
            "return(100)": f"{mean:.1f}", "lag": f"{float(np.mean(lags)):.1f}",
            "dropped": str(books.dropped_lag)})

    def _write_row(self, sps: float, step: int, returns: Sequence[float]) -> None:
        """A row of metrics.jsonl and TensorBoard at `step`: the updates since the last
        row, and the run's figures now (`returns`: the last 100 episodes')."""
        assert self.metrics is not None
        books = self.batcher
        busy = self.wait_seconds + self.train_seconds
        row = {
            **self.rows.take(time.monotonic()),
            "charts/SPS": sps,
            "charts/policy_version": float(self.version),
            "charts/fragments_dropped_lag": float(books.dropped_lag),
            "charts/episodes": float(books.episodes),
            "charts/learner_wait_fraction": self.wait_seconds / max(busy, 1e-9),
            **self.sampler.sample(),
        }
        if self.extra_metrics is not None:
            row.update(self.extra_metrics())
        if returns:
            row["charts/mean_return_100"] = float(np.mean(returns))
        self.metrics.log(step, row)

    # -- at the end ----------------------------------------------------------------
    def write_summary(self, outcome: str, version: int, not_stopped: list[str],
                      best: dict | None = None, failure: str | None = None) -> None:
        """Write summary.json with the verdict, and log both; `best`: the best policy
        kept so far (learner/best.py), if any; `failure`: why the run failed from
        outside the learner (a worker that cannot go on), which is then the verdict: no
        sizing advice for a broken env.

        Raises:
            OutputError: summary.json could not be written (a full disk).
        """
        # checkpoint.py imports torch; this module stays importable without it.
        from hetrl.learner.checkpoint import write_atomic

        assert self.metrics is not None, "open() first"
        if self.rows.updates:  # the last updates' row
            step, returns = self.batcher.progress()
            self._write_row((step - self.start_step) / max(self.metrics.session_seconds, 1e-9),
                            step, returns)
        books, stalled = self.batcher, self.stalled_seconds
        workers = [stream.address for stream in self.streams]
        summary = {
            "outcome": outcome,
            "env": self.settings.env,
            "inference": self.settings.inference,
            "global_step": books.global_step,
            "policy_version": version,
            "wall_seconds": round(self.metrics.wall_seconds, 2),
            "wall_seconds_this_run": round(self.metrics.session_seconds, 2),
            "runs": self.runs,
            "episodes": books.episodes,
            "mean_return_100": self.mean_return_100,
            "fragments_dropped_lag": books.dropped_lag,
            **self.counters(),  # fragments_malformed, sequence_gaps, ...: each once
            "updates_nonfinite": self.updates_nonfinite,
            "policy_lag_histogram": {str(k): v for k, v in sorted(books.lag_histogram.items())},
            "learner_wait_seconds": round(self.wait_seconds, 3),
            "learner_train_seconds": round(self.train_seconds, 3),
            "workers": workers,
            "resumed_from": self.resumed_from,
            "worker_collect_seconds": round(self.worker_collect_seconds, 3),
            "worker_wait_seconds": round(self.worker_wait_seconds, 3),
            "workers_not_stopped": not_stopped,
            "workers_lost": self.workers_lost,
            "stalled_seconds": round(stalled, 2),
            "learner_frozen_seconds": round(self.stall.frozen_seconds, 2),
            "fragments_lost_in_flight": sum(w["fragments_in_flight"]
                                            for w in self.workers_lost),
            "best": best,
            "opened_unix": self.opened_unix,
            "first_update_unix": self.first_update_unix,
            "training_ended_unix": self.training_ended_unix,
            "ended_unix": time.time(),
        }
        if self.summary_extras is not None:
            summary.update(self.summary_extras())
        hosts = {address.rsplit(":", 1)[0] for address in workers}
        verdict = judge(self.wait_seconds, self.train_seconds, self.worker_collect_seconds,
                        self.worker_wait_seconds, len(self.streams), len(hosts),
                        stalled_seconds=stalled, env_steps=books.global_step,
                        synchronous=self.settings.synchronous)
        if failure is not None:
            verdict = dataclasses.replace(verdict, kind="failed", text=failure)
        elif self.verdict_note is not None and (note := self.verdict_note()):
            verdict = dataclasses.replace(verdict, text=f"{verdict.text}; {note}")
        summary["verdict"] = verdict.kind
        summary["verdict_text"] = verdict.text
        write_atomic(self.out / "summary.json", json.dumps(summary, indent=2).encode())
        mean = summary["mean_return_100"]
        best_text = (f"; best {best['mean_return']:,.1f} at step {best['global_step']:,} "
                     f"(by {best['chosen_by']}, {Path(best['path']).name})" if best else "")
        _learner_log.info("%s: %s steps in %.1f s, mean return(100) %s%s", outcome,
                          f"{books.global_step:,}", self.metrics.wall_seconds,
                          "-" if mean is None else f"{mean:,.1f}", best_text)
        if failure is None:
            _learner_log.info("bottleneck: %s", verdict.text)

    def close(self) -> None:
        """The run's settings against its final figures (TensorBoard hparams); close the
        sinks."""
        if self.metrics is None:
            return
        self.metrics.final({"mean_return_100": self.mean_return_100,
                            "global_step": self.batcher.global_step})
        self.metrics.close()


def _cut_after(path: Path, step: int) -> None:
    """Keep only the rows of a metrics file up to `step` (whole or not at all)."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            if json.loads(line)["global_step"] <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
        except (ValueError, KeyError):  # a row cut short by the crash
            continue
    if len(kept) == len(lines):
        return
    log.info("resuming at step %s: %d rows of %s written after that checkpoint were dropped",
             f"{step:,}", len(lines) - len(kept), path.name)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text("".join(kept))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _quiet_tensorboard_thread() -> None:
    """TensorBoard's writer thread re-raises a write error (ENOSPC) as an uncaught thread
    exception, a traceback on stderr; MetricsWriter reports it once itself, so that
    thread's OSError is left out of threading.excepthook."""
    previous = threading.excepthook
    if getattr(previous, "_hetrl_quiet_tb", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(
                args.exc_type, OSError):
            return
        previous(args)

    hook._hetrl_quiet_tb = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _markdown_table(settings: dict) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(settings.items()))
    return f"| setting | value |\n|---|---|\n{rows}"


def _hparams(settings: dict) -> dict:
    """Settings as TensorBoard takes hparams: numbers, strings and bools only."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v)
            for k, v in settings.items()}


def _start_wandb(track: dict, settings: dict, out_dir: Path):
    """wandb.init before the TensorBoard writer exists, so that its scalars are synced.

    Raises:
        ConfigError: wandb is not installed.
    """
    try:
        import wandb  # an optional extra: only --track needs it
    except ImportError as exc:
        raise ConfigError(TRACK_NEEDS) from exc
    return wandb.init(project=track.get("project") or "hetrl", entity=track.get("entity") or None,
                      name=track.get("name") or out_dir.name, config=settings,
                      dir=str(out_dir), sync_tensorboard=True)
