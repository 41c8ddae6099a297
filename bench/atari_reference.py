"""A published PPO learning curve on an Atari game, measured as bench.atari_record
measures hetrl's: the mean game score of the last 100 whole games at each agent step.

CleanRL's and SB3's published Atari figures are taken at the end of 10M agent steps
(their `total_timesteps`, each step 4 emulator frames): 40M frames, four times the
2.5M-step (10M-frame) record. Where a curve at 2.5M steps is wanted, this reads one from
the training logs that rl-baselines3-zoo publishes with its trained agents
(DLR-RM/rl-trained-agents, `ppo/PongNoFrameskip-v4_1`): one SB3 Monitor file per env,
each line a whole game (`r` its unclipped score, `l` its length in emulator frames, as
the Monitor sits below the Atari wrappers). The envs step in lockstep, so a game that
ends after F of its env's frames ends at about n_envs x F / frame_skip agent steps of the
run (to within one game's no-ops).

Run: `python -m bench.atari_reference --monitors DIR --source TEXT` (DIR holds the
`N.monitor.csv` files and, if the zoo saved it, `<env>/config.yml`, whose
hyperparameters the record keeps); record bench/results/summary_atari_reference.json
(docs/atari.md's reference table). The logs are not part of this repository: fetch the
zoo's repository and point --monitors at the run's folder.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import tyro

from bench import common
from bench.atari_record import MILESTONES, _score_at
from hetrl.launch import report

WINDOW = 100
"""Games in the mean, as hetrl's mean return (rollout/models.py's RETURN_WINDOW)."""


@dataclasses.dataclass
class Settings:
    """A published Atari training curve from its SB3 Monitor files."""

    monitors: str
    """The folder of one run's `N.monitor.csv` files, one per env."""
    source: str
    """Where the files come from (repository, commit and folder), for the record."""
    frame_skip: int = 4
    """Emulator frames per agent step."""
    tag: str = ""
    """Record as summary_atari_reference-TAG.json."""


@dataclasses.dataclass(frozen=True)
class Game:
    step: int
    """The run's agent steps when the game ended."""
    score: float


def read_games(folder: Path, frame_skip: int) -> tuple[list[Game], dict[str, Any]]:
    """Every game of the run in the order it ended, and what the files say of it.

    Raises:
        FileNotFoundError: no monitor file in `folder`.
        ValueError: a file is not an SB3 Monitor file.
    """
    files = sorted(folder.glob("*.monitor.csv"), key=lambda p: int(p.name.split(".")[0]))
    if not files:
        raise FileNotFoundError(f"no N.monitor.csv files in {folder}")
    envs = len(files)
    games, env_ids = [], set()
    for path in files:
        with path.open() as f:
            header = f.readline()
            if not header.startswith("#"):
                raise ValueError(f"{path}: not an SB3 Monitor file (no '#{{...}}' header)")
            env_ids.add(json.loads(header[1:]).get("env_id"))
            frames = 0
            for row in csv.DictReader(f):
                frames += int(row["l"])
                games.append(Game(envs * frames // frame_skip, float(row["r"])))
    games.sort(key=lambda g: g.step)
    return games, {"env_ids": sorted(e for e in env_ids if e), "envs": envs}


def curve(games: list[Game]) -> list[report.Point]:
    """The mean score of the last WINDOW games after each game from the WINDOW-th (no
    wall time: the logs' clock is not the run's steps')."""
    window: collections.deque[float] = collections.deque(maxlen=WINDOW)
    points = []
    for game in games:
        window.append(game.score)
        if len(window) == WINDOW:
            points.append(report.Point(sum(window) / WINDOW, game.step, 0.0))
    return points


def score_at(points: list[report.Point], step: int) -> float | None:
    """The mean score as it stood at `step` (its last point at or before it)."""
    before = [p.value for p in points if p.step <= step]
    return before[-1] if before else None


def hyperparameters(folder: Path) -> dict[str, str]:
    """The zoo's saved hyperparameters (`<env>/config.yml`, an OrderedDict dumped as
    `- - name` / `  - value` pairs), as text; {} when there is none."""
    found = sorted(folder.glob("*/config.yml"))
    if not found:
        return {}
    pairs = re.findall(r"- - (\w+)\n\s+- (.+)", found[0].read_text())
    return {name: value.lstrip("- ") for name, value in pairs}


def summarize_run(folder: Path, frame_skip: int) -> dict[str, Any]:
    """The record's results for the run in `folder`."""
    games, about = read_games(folder, frame_skip)
    points = curve(games)
    last = games[-1].step
    reached = {f"{m:g}": report.first_reaching(points, m) for m in MILESTONES}
    return {**about, "games": len(games), "global_step": last, "frames": last * frame_skip,
            "score_at": _score_at(points, last),
            "final_mean_score_100": round(points[-1].value, 2) if points else None,
            "first_reached": {m: p and p.step for m, p in reached.items()},
            "hyperparameters": hyperparameters(folder)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    try:
        result = {"source": s.source, **summarize_run(Path(s.monitors), s.frame_skip)}
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"bench.atari_reference: {exc}; --monitors takes the folder of "
                         "one SB3 run's N.monitor.csv files") from exc
    marks = sorted(int(m) for m in result["score_at"])[:5]
    common.print_table(
        f"{', '.join(result['env_ids'])} ({s.source}): mean score of the last {WINDOW} games",
        [f"{m // 1000:,}k steps" for m in marks] + ["end", "first 15 at step"],
        [[f"{result['score_at'][str(m)]:.1f}" for m in marks]
         + [f"{result['final_mean_score_100']:.1f} ({result['global_step']:,})",
            f"{result['first_reached']['15']:,}" if result["first_reached"]["15"] else "never"]])
    common.write_json("summary_atari_reference" + (f"-{s.tag}" if s.tag else ""), s, result)
    return result


if __name__ == "__main__":
    main()
