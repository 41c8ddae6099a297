"""`hetrl report RUN_DIR [RUN_B]`: a markdown report with plots, cost and a verdict, or
a side-by-side comparison of two runs.

It reads what a run leaves behind (summary.json, metrics.jsonl, settings.json and, for
cluster runs, cluster.json with the instance groups). For one run it writes `report.md`
plus PNG plots into `RUN_DIR/report/`. For two (A, then B) it prints what users compare
first: return against env steps and against wall time (final and best mean return of
the last 100 episodes, the steps and seconds each run took to reach a target return),
env steps per second and the settings that differ; then, where instance types are
known, cost per million env steps and to the target, the way AWS compares homogeneous
and heterogeneous clusters; and it draws both learning curves into one plot in A's
report folder. A run still in progress (metrics.jsonl, no summary.json yet) compares
too. Reading and drawing only; it never changes a run. Longer than most modules: the
report and the comparison share their reading, plotting and number formatting.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hetrl.launch.prices import PriceTable, cost_per_million_steps, load_prices
from hetrl.rollout.errors import ConfigError
from hetrl.rollout.models import RETURN_WINDOW

log = logging.getLogger("hetrl.report")

REPORT_DIR = "report"
RETURN = "charts/mean_return_100"  # the learner's mean return of the last 100 episodes
EPISODES = "charts/episodes"  # episodes ended so far
RUN_FILES = ("summary.json", "metrics.jsonl")  # a directory with neither is not a run


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file; a last line cut short (a run still writing) is left
    out."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            if i == len(lines) - 1:
                break
            raise ConfigError(f"{path}, line {i + 1}, is not JSON ({exc}): the file is "
                              "damaged; remove that line to report on the rest") from exc
    return records


def _not_a_run(path: Path) -> str:
    """What to say about a directory that holds no run, with the runs inside it if any."""
    inside = sorted(str(d) for d in path.iterdir() if d.is_dir()
                    and any((d / name).exists() for name in RUN_FILES))
    hint = (f"runs inside it: {', '.join(inside[:6])}" if inside else
            "give the directory a run wrote (`hetrl local --out`, or the `model` folder "
            "of a job `hetrl fetch` downloaded)")
    return f"{path} is not an hetrl run directory (it has no summary.json or metrics.jsonl); {hint}"


class Run:
    """What one run directory holds."""

    def __init__(self, path: Path) -> None:
        """Read the run in `path`.

        Raises:
            ConfigError: `path` is not a run directory (the message says which runs are
                inside it, if any), or one of its files is damaged.
        """
        self.path = Path(path)
        if not self.path.is_dir():
            raise ConfigError(f"{self.path} is not a directory: give a run directory "
                              "(`hetrl local --out`, or a job fetched by `hetrl fetch`)")
        if not any((self.path / name).exists() for name in RUN_FILES):
            raise ConfigError(_not_a_run(self.path))
        summary = self.path / "summary.json"
        try:
            self.summary: dict[str, Any] = (json.loads(summary.read_text())
                                            if summary.exists() else {})
        except ValueError as exc:
            raise ConfigError(f"{summary} is not JSON ({exc}): the run did not finish "
                              "writing it") from exc
        metrics = self.path / "metrics.jsonl"
        self.records = _read_jsonl(metrics) if metrics.exists() else []
        cluster = self.path / "cluster.json"
        self.cluster = json.loads(cluster.read_text()) if cluster.exists() else {}

    @property
    def steps(self) -> int:
        """Env steps of the run (so far, for a run still in progress)."""
        last = self.records[-1] if self.records else {}
        return int(self.summary.get("global_step", last.get("global_step", 0)))

    @property
    def wall(self) -> float:
        """Wall seconds of the run, across resumes (so far, for one in progress)."""
        last = self.records[-1] if self.records else {}
        return float(self.summary.get("wall_seconds", last.get("wall_seconds", 0.0)))

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.wall if self.wall > 0 else 0.0

    def instances(self, instance_type: str = "") -> list[tuple[str, str, int]]:
        """(group, instance type, count) of the run; `instance_type` stands in for a
        local run that recorded none."""
        groups = self.cluster.get("instances", [])
        if groups:
            return [(g["group"], g["instance_type"], int(g["count"])) for g in groups]
        return [("local", instance_type, 1)] if instance_type else []

    def settings(self) -> dict[str, Any] | None:
        """The run's settings.json, or None when it has none."""
        path = self.path / "settings.json"
        return json.loads(path.read_text()) if path.exists() else None

    def evaluations(self) -> list[dict[str, Any]]:
        """Periodic evaluations (eval/results.jsonl), in step order."""
        path = self.path / "eval" / "results.jsonl"
        return sorted(_read_jsonl(path) if path.exists() else [],
                      key=lambda e: e["global_step"])

    def mean(self, key: str) -> float | None:
        values = [r[key] for r in self.records if key in r]
        return sum(values) / len(values) if values else None


def _eval_kind(evals: list[dict[str, Any]]) -> str:
    """How the evaluator chose actions (records before the option: deterministic)."""
    return "deterministic" if not evals or evals[-1].get("deterministic", True) else "sampled"


def _last_eval(run: Run) -> str:
    evals = run.evaluations()
    if not evals:
        return "none (--eval-every)"
    last = evals[-1]
    return (f"{last['eval_return']:.2f} ± {last['eval_return_std']:.2f} at step "
            f"{last['global_step']:,} ({last.get('episodes', '?')} episodes)")


def price_of(run: Run, prices: PriceTable, instance_type: str = "") -> float | None:
    """Dollars per hour of all the run's instances, or None when unknown."""
    parts = run.instances(instance_type)
    if not parts:
        return None
    return sum(prices.get(t).price_per_hour * n for _, t, n in parts)


def human(value: float, _position: object = None) -> str:
    """A tick label people read at a glance: 100k, 1.5M, 250."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display).

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path, title: str) -> None:
    """Label the axes' ticks for people, title the figure, write it to `path`, close it."""
    from matplotlib.ticker import FuncFormatter

    for ax in fig.axes:
        if ax.get_xlabel() == "env steps":
            ax.xaxis.set_major_formatter(FuncFormatter(human))
        ax.yaxis.set_major_formatter(FuncFormatter(human))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _pyplot().close(fig)


def _return_curves(axes: Sequence[Any], records: list[dict[str, Any]], label: str) -> None:
    """Mean return(100) of `records` against env steps on axes[0], against wall seconds
    on axes[1]."""
    with_return = [r for r in records if RETURN in r]
    for ax, key, xlabel in ((axes[0], "global_step", "env steps"),
                            (axes[1], "wall_seconds", "wall seconds")):
        ax.plot([r[key] for r in with_return], [r[RETURN] for r in with_return], label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)


def _plots(run: Run, out: Path) -> list[tuple[str, str]]:
    """Draw the run's plots; return (title, file name) pairs."""
    plt = _pyplot()
    drawn = []
    recs = run.records
    steps = [r["global_step"] for r in recs]
    env = run.summary.get("env", "")

    def save(fig: Any, name: str, title: str) -> None:
        _save(fig, out / name, f"{title}: {env}")
        drawn.append((title, name))

    evals = run.evaluations()
    if any(RETURN in r for r in recs) or evals:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        _return_curves(axes, recs, "training (mean of last 100 episodes)")
        if evals:
            axes[0].errorbar([e["global_step"] for e in evals], [e["eval_return"] for e in evals],
                             yerr=[e["eval_return_std"] for e in evals], fmt="o-", capsize=3,
                             label=f"evaluation ({_eval_kind(evals)})")
        axes[0].legend(fontsize=7, loc="best")
        save(fig, "learning_curve.png", "Learning curve")
    if recs:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(steps, [r.get("charts/SPS", 0) for r in recs])
        ax.set_xlabel("env steps")
        ax.set_ylabel("env steps / s")
        ax.grid(alpha=0.3)
        save(fig, "steps_per_second.png", "Throughput")
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for key, label in (("utilisation/learner_busy_fraction", "learner busy"),
                           ("utilisation/worker_busy_fraction", "workers busy"),
                           ("utilisation/host_cpu_percent", "learner host CPU / 100"),
                           ("utilisation/gpu_percent", "GPU / 100")):
            values = [(r["global_step"], r[key]) for r in recs if key in r]
            if values:
                scale = 100.0 if "percent" in key else 1.0
                ax.plot([s for s, _ in values], [v / scale for _, v in values], label=label)
        for key in sorted({k for r in recs for k in r if k.startswith("utilisation/env_host")}):
            values = [(r["global_step"], r[key]) for r in recs if key in r]
            ax.plot([s for s, _ in values], [v / 100 for _, v in values],
                    label=key.split("/", 1)[1] + " / 100", linestyle="--")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("env steps")
        ax.set_ylabel("fraction busy")
        if ax.get_legend_handles_labels()[0]:  # beside the axes: never over a line
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(alpha=0.3)
        save(fig, "utilisation.png", "Utilisation per group")
    lags = run.summary.get("policy_lag_histogram") or {}
    if lags:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar([int(k) for k in lags], list(lags.values()))
        ax.set_xlabel("policy lag (updates)")
        ax.set_ylabel("fragments")
        save(fig, "policy_lag.png", "Policy lag")
    return drawn


def write_report(path: Path, instance_type: str = "", prices_file: str | None = None) -> Path:
    """Write RUN_DIR/report/report.md (and plots); return its path."""
    run = Run(path)
    prices = load_prices(prices_file)
    out = run.path / REPORT_DIR
    out.mkdir(exist_ok=True)
    s = run.summary
    rows = [
        ("env", s.get("env")),
        ("outcome", s.get("outcome", "running (no summary.json yet)")),
        ("env steps", f"{run.steps:,}"),
        ("wall seconds", f"{run.wall:.1f}"),
        ("env steps / s", f"{run.steps_per_second:,.0f}"),
        ("mean return (last 100 episodes)", s.get("mean_return_100")),
        (f"evaluation return at the end ({_eval_kind(run.evaluations())})", _last_eval(run)),
        ("workers / env hosts", f"{len(s.get('workers', []))} / "
                                f"{len({w.rsplit(':', 1)[0] for w in s.get('workers', [])})}"),
        ("fragments dropped for lag / malformed / lost", f"{s.get('fragments_dropped_lag', 0)}"
         f" / {s.get('fragments_malformed', 0)} / {s.get('sequence_gaps', 0)}"),
    ]
    lost = s.get("workers_lost") or []
    if lost:
        rows.append(("workers lost for good (fragments in flight)", ", ".join(
            f"{w['address']} at step {w['global_step']:,} ({w['fragments_in_flight']})"
            for w in lost)))
    if s.get("workers_not_stopped"):
        rows.append(("workers that ignored the final stop",
                     ", ".join(s["workers_not_stopped"])))
    lines = [f"# hetrl run report: `{run.path}`", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "## Cost", ""]
    price = price_of(run, prices, instance_type)
    if price is None:
        lines.append("Unknown: a local run records no instance type; pass --instance-type to "
                     "`hetrl report` (or `hetrl local`) to price it.")
    else:
        lines += ["| group | instance type | count | $/h each |", "|---|---|---|---|"]
        for group, kind, count in run.instances(instance_type):
            lines.append(f"| {group} | {kind} | {count} | {prices.get(kind).price_per_hour} |")
        per_m = cost_per_million_steps(price, run.steps_per_second)
        lines += [
            "",
            f"- price: ${price:.3f}/h (on-demand, {prices.region}); spot at "
            f"{prices.spot_discount:.0%} off: ${price * (1 - prices.spot_discount):.3f}/h",
            f"- cost so far: ${price * run.wall / 3600:.4f}",
            f"- cost per million env steps: ${per_m:.4f} on-demand, "
            f"${per_m * (1 - prices.spot_discount):.4f} spot",
        ]
    lines += ["", "## Utilisation (means over the run)", ""]
    for key, label in (("utilisation/learner_busy_fraction", "learner busy (training)"),
                       ("utilisation/worker_busy_fraction", "workers busy (stepping)"),
                       ("utilisation/host_cpu_percent", "learner host CPU %"),
                       ("utilisation/gpu_percent", "GPU %"),
                       ("charts/policy_lag", "policy lag (updates)")):
        value = run.mean(key)
        if value is not None:
            lines.append(f"- {label}: {value:.2f}")
    lines += ["", "## Verdict", "", s.get("verdict_text", "no verdict recorded"), ""]
    try:
        plots = _plots(run, out)
    except ImportError:
        plots = []
        lines.append("(no plots: matplotlib is not installed; "
                     "`pip install 'hetrl[plots]'` adds them)")
    for title, name in plots:
        lines += [f"### {title}", "", f"![{title}]({name})", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report


def try_write_report(path: Path, instance_type: str = "") -> Path | None:
    """write_report at the end of a run: a failure to report never fails the run."""
    try:
        report = write_report(path, instance_type)
    except Exception as exc:  # the run's results matter more than its report
        log.warning("could not write the run report for %s: %s", path, exc)
        return None
    log.info("report: %s", report)
    return report


# -- comparing two runs -------------------------------------------------------------

# Settings that differ between any two runs without changing what they compare.
_INCIDENTAL = {"out", "checkpoint_dir", "finishing_file", "worker_addresses", "progress",
               "instance_type", "resume", "overwrite"}
_ABSENT = object()  # a setting one run's settings.json does not have (an older hetrl)


def _count(value: float) -> str:
    """A whole number with thousands separators: 1,234,567."""
    return f"{value:,.0f}"


def _return(value: float) -> str:
    """A return as people read it: one decimal, thousands separators."""
    return f"{value:,.1f}"


def _seconds(value: float) -> str:
    """Wall seconds, with minutes or hours beside them when there are many."""
    text = f"{value:,.1f} s" if value < 1000 else f"{value:,.0f} s"
    if value >= 3600:
        return f"{text} ({value / 3600:.1f} h)"
    return f"{text} ({value / 60:.0f} min)" if value >= 120 else text


def _dollars(value: float) -> str:
    """Dollars: cents from $1 on, three significant digits below ($0.0123)."""
    if not math.isfinite(value):
        return "n/a"
    return f"${value:,.2f}" if value >= 1 else f"${value:.3g}"


def _ratio(a: float, b: float) -> str:
    """B against A as a factor (`2.00x`), empty where it is not a number."""
    return f"{b / a:.2f}x" if a and math.isfinite(a) and math.isfinite(b) else ""


def _setting(value: Any) -> str:
    """A setting's value as people read it (0.93, not 0.9300000071525574)."""
    if value is _ABSENT:
        return "(not recorded)"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_setting(v) for v in value) + "]"
    if isinstance(value, str):
        return value or '""'
    return str(value)


def _row(label: str, cells: Sequence[str],
         values: Sequence[float | None] = ()) -> list[str]:
    """A table row: its label, A's and B's cells, and B against A where both values are
    known."""
    known = [v for v in values if v is not None]
    return [label, *cells, _ratio(*known) if len(known) == 2 else ""]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table with its columns padded, so that it also reads as printed."""
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
            *(line(row) for row in rows)]


@dataclasses.dataclass(frozen=True)
class Point:
    """A mean return of the last 100 episodes and when the run had it."""

    value: float
    step: int
    seconds: float
    full: bool = True
    """Whether 100 episodes had ended (a mean of fewer says little; runs that do not
    record the count are taken as full)."""

    def when(self) -> str:
        """`12,000 steps, 34.5 s`."""
        return f"{_count(self.step)} steps, {_seconds(self.seconds)}"


def return_curve(run: Run) -> list[Point]:
    """The run's mean return(100) after each update, in order.

    Raises:
        ConfigError: the run has finished no episode yet.
    """
    points = [Point(float(r[RETURN]), int(r["global_step"]), float(r["wall_seconds"]),
                    r.get(EPISODES, RETURN_WINDOW) >= RETURN_WINDOW)
              for r in run.records if RETURN in r]
    if not points:
        raise ConfigError(
            f"{run.path} has no finished episode yet ({_count(run.steps)} env steps, "
            f"{len(run.records)} updates in metrics.jsonl, none with {RETURN}): there is no "
            "return to compare; let it run until episodes end (check that the env ends "
            "them, e.g. with a TimeLimit), then compare again")
    return points


def judged(curve: Sequence[Point]) -> list[Point]:
    """The points that judge a run (best, first to reach a target): those over a full
    window of 100 episodes, or every point of a run that never had 100 (a lucky first
    episode or two would otherwise stand as the best or the first to reach a target)."""
    return [p for p in curve if p.full] or list(curve)


def first_reaching(curve: Sequence[Point], target: float) -> Point | None:
    """The first point whose mean return reached `target`, or None."""
    return next((p for p in curve if p.value >= target), None)


def settings_differences(a: Run, b: Run) -> list[tuple[str, str, str]]:
    """(setting, A's value, B's value) for each setting that differs, paths and the
    like left out; empty when either run has no settings.json."""
    sa, sb = a.settings(), b.settings()
    if sa is None or sb is None:
        return []
    return [(k, _setting(sa.get(k, _ABSENT)), _setting(sb.get(k, _ABSENT)))
            for k in sorted(set(sa) | set(sb))
            if k not in _INCIDENTAL and sa.get(k, _ABSENT) != sb.get(k, _ABSENT)]


def _settings_section(runs: Sequence[Run]) -> list[str]:
    lines = ["## Settings that differ", ""]
    missing = [f"{name} ({run.path})" for name, run in zip("AB", runs, strict=True)
               if run.settings() is None]
    if missing:
        return lines + [f"Not compared: no settings.json in {' and '.join(missing)}.", ""]
    differ = settings_differences(*runs)
    if not differ:
        return lines + ["None: the runs share every setting (paths and the like aside).", ""]
    return lines + _table(("setting", "A", "B"), differ) + [""]


def _cost_section(runs: Sequence[Run], types: Sequence[str], prices_file: str | None,
                  reached: Sequence[Point | None], target: float,
                  settings_differ: bool) -> list[str]:
    """Cost per million env steps and to the target return, for the runs whose instance
    types are known; a line saying how to price the others."""
    how = ("pass --instance-type with one type per run, A's first (e.g. `--instance-type "
           "ml.c5.2xlarge ml.g5.xlarge`); a cluster run records its own in cluster.json")
    if not any(run.instances(t) for run, t in zip(runs, types, strict=True)):
        return ["## Cost", "", f"Not priced: neither run records its instance types; {how}.",
                ""]
    prices = load_prices(prices_file)
    price = [price_of(run, prices, t) for run, t in zip(runs, types, strict=True)]
    per_m = [None if p is None else cost_per_million_steps(p, run.steps_per_second)
             for p, run in zip(price, runs, strict=True)]
    spot = 1 - prices.spot_discount
    costs = [None if p is None or r is None else p * r.seconds / 3600
             for p, r in zip(price, reached, strict=True)]
    so_far = [None if p is None else p * run.wall / 3600
              for p, run in zip(price, runs, strict=True)]

    def dollars(values: Sequence[float | None]) -> list[str]:
        return ["unknown" if v is None else _dollars(v) for v in values]

    rows = [
        _row("instances", [" + ".join(f"{n} x {k}" for _, k, n in run.instances(t)) or "unknown"
                           for run, t in zip(runs, types, strict=True)]),
        _row("price per hour (on-demand)", dollars(price), price),
        _row("cost per million env steps", dollars(per_m), per_m),
        _row(f"  spot ({prices.spot_discount:.0%} off)",
             dollars([None if v is None else v * spot for v in per_m])),
        _row(f"cost to mean return {_return(target)}",
             ["unknown" if p is None else "not reached" if c is None else _dollars(c)
              for p, c in zip(price, costs, strict=True)], costs),
        _row("cost so far", dollars(so_far), so_far),
    ]
    lines = ["## Cost", "", *_table(("", "A", "B", "B vs A"), rows), "",
             f"Prices: {prices.region}, on-demand."]
    if None in price:
        lines.append(f"Run {'AB'[price.index(None)]} is not priced: {how}.")
    if settings_differ:
        lines.append("The runs differ in settings as well as instances: the cost "
                     "difference is not of the hardware alone.")
    return lines + [""]


def _comparison_plot(runs: Sequence[Run], target: float, reached: Sequence[Point | None],
                     path: Path) -> None:
    """Both runs' mean return(100) against env steps and against wall seconds, with the
    target return and where each run first reached it."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, run, point in zip("AB", runs, reached, strict=True):
        _return_curves(axes, run.records, f"{name}: {run.path.name}")
        if point is not None:
            color = axes[0].lines[-1].get_color()
            axes[0].plot([point.step], [point.value], "o", color=color)
            axes[1].plot([point.seconds], [point.value], "o", color=color)
    for ax in axes:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1,
                   label=f"target {_return(target)}")
    axes[0].legend(fontsize=7, loc="best")
    _save(fig, path, "Mean return of the last 100 episodes: A against B")


def compare(path_a: Path, path_b: Path, type_a: str = "", type_b: str = "",
            prices_file: str | None = None, target_return: float | None = None) -> str:
    """Two runs side by side (B against A), as markdown that also reads as printed.

    Return against env steps and wall time (final and best mean return of the last 100
    episodes, the steps and seconds to reach `target_return`, by default the lower of
    the two runs' best), env steps per second, the settings that differ, the cost where
    instance types are known (from cluster.json, else `type_a`/`type_b`), and the path
    of a plot of both learning curves written into A's report folder.

    Raises:
        ConfigError: a path is not a run directory, a run has finished no episode yet,
            or an instance type has no price.
    """
    runs = (Run(path_a), Run(path_b))
    curves = [judged(return_curve(run)) for run in runs]
    best = [max(curve, key=lambda p: p.value) for curve in curves]
    if target_return is None:
        lower = 0 if best[0].value <= best[1].value else 1
        target = best[lower].value
        target_note = (f"Target return {_return(target)}: the lower of the two runs' best "
                       f"({'AB'[lower]}'s); set another with --target-return.")
    else:
        target = target_return
        target_note = f"Target return {_return(target)} (--target-return)."
    reached = [first_reaching(curve, target) for curve in curves]
    final = [curve[-1] for curve in curves]

    rate = [run.steps_per_second for run in runs]
    envs = [run.summary.get("env") or (run.settings() or {}).get("env", "?") for run in runs]
    rows = [
        _row("env", envs),
        _row("outcome", [run.summary.get("outcome", "running (no summary.json yet)")
                         for run in runs]),
        _row("env steps", [_count(run.steps) for run in runs], [run.steps for run in runs]),
        _row("wall time", [_seconds(run.wall) for run in runs], [run.wall for run in runs]),
        _row("env steps / s", [_count(r) for r in rate], rate),
        ["final mean return (100)", *(_return(p.value) for p in final),
         f"{final[1].value - final[0].value:+,.1f}"],
        ["best mean return (100)", *(_return(p.value) for p in best),
         f"{best[1].value - best[0].value:+,.1f}"],
        _row("  reached at", [p.when() for p in best]),
        _row(f"env steps to mean return {_return(target)}",
             ["not reached" if r is None else _count(r.step) for r in reached],
             [None if r is None else r.step for r in reached]),
        _row(f"wall time to mean return {_return(target)}",
             ["not reached" if r is None else _seconds(r.seconds) for r in reached],
             [None if r is None else r.seconds for r in reached]),
        _row("verdict", [run.summary.get("verdict", "-") for run in runs]),
    ]
    lines = ["# Two runs side by side", "",
             f"A: {runs[0].path}", f"B: {runs[1].path}", "",
             "## Return, throughput", "", *_table(("", "A", "B", "B vs A"), rows), "",
             target_note]
    if envs[0] != envs[1]:
        lines.append(f"The runs train different envs ({envs[0]}, {envs[1]}): their returns "
                     "do not compare.")
    lines += ["", *_settings_section(runs)]
    lines += _cost_section(runs, (type_a, type_b), prices_file, reached, target,
                           bool(settings_differences(*runs)))
    plot = runs[0].path / REPORT_DIR / f"compare_{_file_name(runs[1].path)}.png"
    try:
        plot.parent.mkdir(exist_ok=True)
        _comparison_plot(runs, target, reached, plot)
        lines.append(f"Plot: {plot}")
    except ImportError:
        lines.append("(no plot: matplotlib is not installed; `pip install 'hetrl[plots]'` adds it)")
    return "\n".join(lines)


def _file_name(path: Path) -> str:
    """A run directory's name, safe in a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", path.resolve().name) or "run"
