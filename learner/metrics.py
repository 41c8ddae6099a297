"""Where training metrics go: TensorBoard events, a JSONL file, and a live progress line.

Metric names follow CleanRL (`charts/episodic_return`, `charts/SPS`, `losses/...`) so
curves compare with published ones. Every record in metrics.jsonl carries
`global_step` and `wall_seconds`. Metrics are worth less than the run: a sink that
fails to write (a full disk) is dropped with one warning naming its path, and training
goes on. Nothing here decides anything about training.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("hetrl.metrics")

TRACK_NEEDS = ("--track logs to Weights & Biases: pip install 'hetrl[track]' (and wandb "
               "login, or WANDB_MODE=offline)")


class StallWatch:
    """Notices when no fragment arrives from any worker for `threshold` seconds while the
    learner waits: every worker stalled (a hung env everywhere, frozen hosts, a cut
    network). Warns once per stall as it happens, and when it ends, and adds up the
    stalled seconds so the verdict can tell a stall from a shortage of workers. It
    watches from the first fragment on: before it, connect timeouts apply."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self._last: float | None = None
        self._warned = False
        self._stalled = 0.0  # seconds of stalls that have ended
        self.stalls = 0

    def fragment(self) -> None:
        """A fragment arrived."""
        now = time.monotonic()
        if self._warned and self._last is not None:
            gap = now - self._last
            self._stalled += gap
            log.warning("fragments arrive again after a %.0f s stall", gap)
            self._warned = False
        self._last = now

    def waiting(self, workers: int) -> None:
        """The learner is waiting for fragments (called every fraction of a second)."""
        if self._last is None:
            return
        gap = time.monotonic() - self._last
        if gap > self.threshold and not self._warned:
            self._warned = True
            self.stalls += 1
            log.warning("no fragment from any of the %d workers for %.0f s: every worker is "
                        "stalled (an env hung everywhere, frozen env hosts, or the network), "
                        "which more workers would not fix; training resumes when they do",
                        workers, gap)

    @property
    def stalled_seconds(self) -> float:
        """Seconds spent in stalls, the one going on included."""
        ongoing = (time.monotonic() - self._last
                   if self._warned and self._last is not None else 0.0)
        return self._stalled + ongoing


class MetricsWriter:
    """Append-only metrics sink for one run directory."""

    def __init__(self, out_dir: Path, progress: bool = True, progress_every: float = 2.0,
                 wall_offset: float = 0.0, settings: dict | None = None,
                 track: dict | None = None) -> None:
        """Args:
            settings: the run's settings, written to TensorBoard as text and hparams.
            track: Weights & Biases project/entity/name (CleanRL's --track): the run's
                TensorBoard scalars are mirrored there (wandb's sync_tensorboard).
        """
        from torch.utils.tensorboard import SummaryWriter  # heavy import, learner only

        out_dir.mkdir(parents=True, exist_ok=True)
        self._settings = dict(settings or {})
        self._wandb = _start_wandb(track, self._settings, out_dir) if track else None
        self._jsonl_path, self._tb_path = out_dir / "metrics.jsonl", out_dir / "tb"
        self._jsonl = None
        self._tb = None
        try:
            self._jsonl = self._jsonl_path.open("a", buffering=1)
        except OSError as exc:
            self._give_up("_jsonl", self._jsonl_path, exc)
        try:
            self._tb = SummaryWriter(str(self._tb_path))
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
        self._bar = None  # a tqdm bar on a terminal, made at the first progress call

    def _give_up(self, sink: str, path: Path, exc: BaseException) -> None:
        """Drop one sink for the rest of the run, with one warning."""
        log.warning("cannot write metrics to %s (%s: %s); they are no longer written there, "
                    "training goes on", path, type(exc).__name__, exc)
        handle, _ = getattr(self, sink), setattr(self, sink, None)
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
                from tqdm import tqdm

                self._bar = tqdm(total=total, initial=0, unit="step", unit_scale=True,
                                 dynamic_ncols=True, file=sys.stderr, smoothing=0.1)
            self._bar.update(max(0, min(step, total) - self._bar.n))
            self._bar.set_postfix(fields, refresh=False)
            return
        now = time.monotonic()
        if now - self._last_progress < self._progress_every:
            return
        self._last_progress = now
        eta = (total - step) / rate if rate > 0 and step < total else 0.0
        extra = " | ".join(f"{k} {v}" for k, v in fields.items())
        sys.stderr.write(f"step {step:>10,}/{total:,} ({min(step / total, 1):5.1%}) | "
                         f"{rate:>7,.0f} SPS | ETA {_clock(eta)} | {extra}\n")
        sys.stderr.flush()

    def final(self, values: dict[str, float]) -> None:
        """The run's settings against its final figures, as TensorBoard hparams."""
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
        import wandb
    except ImportError as exc:
        from hetrl.rollout.errors import ConfigError

        raise ConfigError(TRACK_NEEDS) from exc
    return wandb.init(project=track.get("project") or "hetrl", entity=track.get("entity") or None,
                      name=track.get("name") or out_dir.name, config=settings,
                      dir=str(out_dir), sync_tensorboard=True)
