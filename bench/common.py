"""Reporting shared by every benchmark: statistics, the printed table, JSON, PNG plots.

Every figure a benchmark reports is the median of several runs with their min and max
(`summarize`), because this machine is noisy; ratios are taken between runs made in
the same invocation. Results go to `bench/results/<name>.json` with a description of
the machine, and plots next to them when matplotlib is installed. Nothing here starts
processes or touches the network.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements (and the raw values)."""
    values = [float(v) for v in values]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": [round(v, 6) for v in values],
    }


def fmt(stat: dict[str, Any] | None, spec: str = ",.0f") -> str:
    """'median [min-max]' for a summarize() result."""
    if not stat or stat.get("median") is None:
        return "-"
    med, lo, hi = stat["median"], stat["min"], stat["max"]
    if stat["n"] == 1:
        return format(med, spec)
    return f"{med:{spec}} [{lo:{spec}}-{hi:{spec}}]"


def mean_span(scores: list[float]) -> str:
    """'mean (lowest to highest)' of seeds' scores; '-' when there are none."""
    if not scores:
        return "-"
    return f"{sum(scores) / len(scores):.1f} ({min(scores):.1f} to {max(scores):.1f})"


def verdict(value: float | None, target: float, higher_is_better: bool = True) -> str:
    if value is None:
        return "-"
    ok = value >= target if higher_is_better else value <= target
    return "PASS" if ok else "FAIL"


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain-text table, columns sized to fit."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    print(f"\n{title}\n{line}")
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in
                        enumerate(zip(row, widths, strict=True))))
        if i == 0:
            print(line)
    sys.stdout.flush()


CODE_PATHS = ("rollout", "learner", "launch", "protos", "bench", ":!bench/results")
"""What a figure's code is: changed and not committed, the commit alone does not say it."""


def git_commit(root: Path = ROOT) -> str:
    """The checkout's short commit, with "+changes" when the code (CODE_PATHS) differs
    from it; '' outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                                capture_output=True, text=True, timeout=5).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                  "--", *CODE_PATHS], cwd=root, capture_output=True,
                                 text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{commit}+changes" if commit and changed else commit


LOADAVG_AT_START = os.getloadavg()
"""The load averages when the benchmark started: each benchmark is its own process, and
this module is imported as it starts (a record is written at its end)."""


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    import grpc
    import numpy
    import torch

    cpu = ""
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                cpu = text.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus_usable": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "grpcio": grpc.__version__,
        "git": git_commit(),
        "loadavg_at_start": LOADAVG_AT_START,
        "loadavg_at_end": os.getloadavg(),
    }


def stem(name: str, settings: Any) -> str:
    """File name stem of a result: quick (smoke) runs never overwrite real figures."""
    return f"{name}-quick" if getattr(settings, "quick", False) else name


def write_json(name: str, settings: Any, results: Any) -> Path:
    """Write bench/results/<name>[-quick].json: settings, machine, results, timestamp."""
    import dataclasses

    name = stem(name, settings)
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
        "settings": dataclasses.asdict(settings) if dataclasses.is_dataclass(settings)
        else settings,
        "machine": machine_info(),
        "results": results,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {path.relative_to(ROOT)}")
    return path


def plot(name: str, draw: Callable[[Any], None], enabled: bool = True) -> Path | None:
    """Call draw(pyplot) and save bench/results/<name>.png; skipped without matplotlib."""
    if not enabled:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot; pip install matplotlib)")
        return None
    RESULTS.mkdir(parents=True, exist_ok=True)
    plt.figure(figsize=(7, 4.5))
    draw(plt)
    plt.grid(True, alpha=0.3)
    plt.tight_layout()
    path = RESULTS / f"{name}.png"
    plt.savefig(path, dpi=110)
    plt.close("all")
    print(f"wrote {path.relative_to(ROOT)}")
    return path


def errorbar(plt: Any, xs: Sequence[float], stats: Sequence[dict], label: str, **kw) -> None:
    """Plot medians with min-max error bars."""
    med = [s["median"] for s in stats]
    low = [s["median"] - s["min"] for s in stats]
    high = [s["max"] - s["median"] for s in stats]
    plt.errorbar(xs, med, yerr=[low, high], marker="o", capsize=3, label=label, **kw)


class ForeignLoad:
    """How many cores processes other than `pids` kept busy between start() and stop().

    Read from /proc: machine-wide busy time minus the CPU time of our own processes.
    The benchmarks report it next to each figure so a noisy run shows itself.
    """

    def __init__(self, pids: Sequence[int], children: bool = False) -> None:
        self.pids = list(pids)
        self.children = children  # count our waited-for children too (cutime, cstime)
        self._start: tuple[float, float, float] | None = None

    @staticmethod
    def _busy() -> float:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def _ours(self) -> float:
        total = 0.0
        for pid in self.pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            fields = stat[11:15] if self.children else stat[11:13]
            total += sum(float(x) for x in fields) / os.sysconf("SC_CLK_TCK")
        return total

    def start(self) -> ForeignLoad:
        self._start = (time.perf_counter(), self._busy(), self._ours())
        return self

    def stop(self) -> float:
        t0, busy0, ours0 = self._start
        elapsed = time.perf_counter() - t0
        return max(0.0, ((self._busy() - busy0) - (self._ours() - ours0)) / max(elapsed, 1e-9))
