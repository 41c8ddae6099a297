"""`hetrl report RUN_DIR [RUN_B]`: a markdown report with plots, cost and a verdict.

It reads what a run leaves behind (summary.json, metrics.jsonl, settings.json and, for
cluster runs, cluster.json with the instance groups) and writes `report.md` plus PNG
plots into `RUN_DIR/report/`. Two runs are compared side by side the way AWS compares
homogeneous and heterogeneous clusters: price per hour, time per million env steps,
cost per million env steps and the improvement. Reading and drawing only; it never
changes a run.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hetrl.launch.prices import PriceTable, cost_per_million_steps, load_prices
from hetrl.rollout.errors import ConfigError

log = logging.getLogger("hetrl.report")

REPORT_DIR = "report"


class Run:
    """What one run directory holds."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        summary = self.path / "summary.json"
        if not summary.exists():
            raise ConfigError(f"{self.path} has no summary.json: is it an hetrl run directory?")
        self.summary: dict[str, Any] = json.loads(summary.read_text())
        metrics = self.path / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        self.records = [json.loads(line) for line in lines if line.strip()]
        cluster = self.path / "cluster.json"
        self.cluster = json.loads(cluster.read_text()) if cluster.exists() else {}

    @property
    def steps(self) -> int:
        return int(self.summary.get("global_step", 0))

    @property
    def wall(self) -> float:
        return float(self.summary.get("wall_seconds", 0.0))

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

    def evaluations(self) -> list[dict[str, Any]]:
        """Periodic evaluations (eval/results.jsonl), in step order."""
        path = self.path / "eval" / "results.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return sorted((json.loads(line) for line in lines if line.strip()),
                      key=lambda e: e["global_step"])

    def mean(self, key: str) -> float | None:
        values = [r[key] for r in self.records if key in r]
        return sum(values) / len(values) if values else None


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


def _plots(run: Run, out: Path) -> list[tuple[str, str]]:
    """Draw the run's plots; return (title, file name) pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    drawn = []
    recs = run.records
    steps = [r["global_step"] for r in recs]
    env = run.summary.get("env", "")

    def save(fig, name: str, title: str) -> None:
        for ax in fig.axes:
            if ax.get_xlabel() == "env steps":
                ax.xaxis.set_major_formatter(FuncFormatter(human))
            ax.yaxis.set_major_formatter(FuncFormatter(human))
        fig.suptitle(f"{title}: {env}", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        drawn.append((title, name))

    with_return = [r for r in recs if "charts/mean_return_100" in r]
    evals = run.evaluations()
    if with_return or evals:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        for ax, key, label in ((axes[0], "global_step", "env steps"),
                               (axes[1], "wall_seconds", "wall seconds")):
            ax.plot([r[key] for r in with_return],
                    [r["charts/mean_return_100"] for r in with_return],
                    label="training (mean of last 100 episodes)")
            ax.set_xlabel(label)
            ax.set_ylabel("return")
            ax.grid(alpha=0.3)
        if evals:
            axes[0].errorbar([e["global_step"] for e in evals], [e["eval_return"] for e in evals],
                             yerr=[e["eval_return_std"] for e in evals], fmt="o-", capsize=3,
                             label="evaluation (deterministic)")
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
        ("outcome", s.get("outcome")),
        ("env steps", f"{run.steps:,}"),
        ("wall seconds", f"{run.wall:.1f}"),
        ("env steps / s", f"{run.steps_per_second:,.0f}"),
        ("mean return (last 100 episodes)", s.get("mean_return_100")),
        ("evaluation return at the end (deterministic)", _last_eval(run)),
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
        lines.append("(matplotlib is not installed: no plots)")
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


# Settings that differ between any two runs without changing what they compare.
_INCIDENTAL = {"out", "checkpoint_dir", "finishing_file", "worker_addresses", "progress",
               "instance_type", "resume", "overwrite"}


def settings_differences(a: Run, b: Run) -> list[str]:
    """`name: A -> B` for each setting (but paths and the like) that differs."""
    def read(run: Run) -> dict[str, Any]:
        path = run.path / "settings.json"
        return json.loads(path.read_text()) if path.exists() else {}

    sa, sb = read(a), read(b)
    return [f"{k}: {sa.get(k)!r} -> {sb.get(k)!r}" for k in sorted(set(sa) | set(sb))
            if k not in _INCIDENTAL and sa.get(k) != sb.get(k)]


def seconds_to_return(run: Run, target: float) -> float | None:
    """Wall seconds until the mean return of the last 100 episodes first reached
    `target`, or None if it never did."""
    for record in run.records:
        if record.get("charts/mean_return_100", float("-inf")) >= target:
            return float(record["wall_seconds"])
    return None


def compare(path_a: Path, path_b: Path, type_a: str = "", type_b: str = "",
            prices_file: str | None = None, target_return: float | None = None) -> str:
    """A markdown table comparing two runs' price performance (B against A), with the
    cost to reach `target_return` when given, and a warning when the runs differ in
    more than their instances (then the comparison is not only of the hardware)."""
    prices = load_prices(prices_file)
    runs = [Run(path_a), Run(path_b)]
    priced = [price_of(r, prices, t) for r, t in zip(runs, (type_a, type_b), strict=True)]
    price = [p for p in priced if p is not None]
    if len(price) < len(priced):
        raise ConfigError("both runs need instance types to compare cost: pass --instance-type "
                          "for local runs (RUN_A's first, then RUN_B's)")
    rate = [r.steps_per_second for r in runs]
    per_m = [cost_per_million_steps(p, v) for p, v in zip(price, rate, strict=True)]
    desc = [" + ".join(f"{n} x {t}" for _, t, n in r.instances(t0))
            for r, t0 in zip(runs, (type_a, type_b), strict=True)]
    gain = (1 - per_m[1] / per_m[0]) * 100 if per_m[0] > 0 else float("nan")
    reach = []
    if target_return is not None:
        cells = []
        for run, p in zip(runs, price, strict=True):
            seconds = seconds_to_return(run, target_return)
            cells.append("not reached" if seconds is None
                         else f"${p * seconds / 3600:.4f} ({seconds:.0f} s)")
        reach = [f"| cost to reach mean return {target_return:g} | {cells[0]} | {cells[1]} |"]
    differ = settings_differences(*runs)
    warning = ([f"Warning: the runs differ in more than their instances ({'; '.join(differ)})"
                ": the comparison is not of the hardware alone.", ""] if differ else [])
    return "\n".join([
        *warning,
        "| | A | B |",
        "|---|---|---|",
        f"| run | `{runs[0].path}` | `{runs[1].path}` |",
        f"| instances | {desc[0]} | {desc[1]} |",
        f"| price per hour | ${price[0]:.3f} | ${price[1]:.3f} |",
        f"| env steps / s | {rate[0]:,.0f} | {rate[1]:,.0f} |",
        f"| seconds per million env steps | {1e6 / rate[0]:.1f} | {1e6 / rate[1]:.1f} |",
        f"| cost per million env steps | ${per_m[0]:.4f} | ${per_m[1]:.4f} |",
        f"| improvement of B over A (cost per step) | | {gain:+.1f}% |",
        *reach,
        f"| verdict | {runs[0].summary.get('verdict', '-')} | "
        f"{runs[1].summary.get('verdict', '-')} |",
    ])
