"""Published learning curves on an Atari game at the agent steps of bench.atari_record's
record: a PPO run's mean game score of the last 100 whole games, as the record measures
hetrl's, and under sticky actions Dopamine's agents, seed by seed.

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

No published PPO curve plays v5's sticky actions at these steps. Dopamine publishes its
agents' curves under them (Machado et al.'s protocol, ALE's v5 default): 5 seeds each of
DQN, C51, Rainbow, IQN and more, `baselines/atari/data/<game>.json` in google/dopamine.
Each entry is one iteration of one seed: 250,000 agent steps (1M frames) of training,
and the mean unclipped score of the whole games played in it (training games: the
agent explores with epsilon 0.01). `--dopamine FILE --source TEXT` reads one game's file
and records each agent's seeds at the same 500k-step marks (the iteration that ends at
the mark), as summary_atari_reference-dopamine.json unless --tag says otherwise.
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
from bench.atari_record import MILESTONES, SCORE_EVERY, _score_at
from hetrl.launch import report

WINDOW = 100
"""Games in the mean, as hetrl's mean return (rollout/models.py's RETURN_WINDOW)."""


@dataclasses.dataclass
class Settings:
    """A published Atari training curve: an SB3 run's Monitor files, or Dopamine's
    baselines file for one game."""

    source: str
    """Where the files come from (repository, commit and folder), for the record."""
    monitors: str = ""
    """The folder of one run's `N.monitor.csv` files, one per env."""
    dopamine: str = ""
    """Instead of --monitors: one game's Dopamine baselines file (`<game>.json`)."""
    frame_skip: int = 4
    """Emulator frames per agent step."""
    tag: str = ""
    """Record as summary_atari_reference-TAG.json (--dopamine: TAG defaults to dopamine)."""


DOPAMINE_ITERATION = 250_000
"""Agent steps of one Dopamine iteration (its gin configs' Runner.training_steps)."""


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


def read_dopamine(path: Path) -> dict[str, list[dict[int, float]]]:
    """Each agent's seeds in a Dopamine baselines file, each seed as {iteration: mean
    score}. The file lists a seed's iterations in order and the next seed starts again
    at iteration 0.

    Raises:
        ValueError: the file is not a list of {Iteration, Value, Agent} entries.
    """
    entries = json.loads(path.read_text())
    agents: dict[str, list[dict[int, float]]] = {}
    try:
        for entry in entries:
            seeds = agents.setdefault(str(entry["Agent"]), [])
            iteration = int(entry["Iteration"])
            if not seeds or iteration in seeds[-1]:
                seeds.append({})
            seeds[-1][iteration] = float(entry["Value"])
    except (TypeError, KeyError) as exc:
        raise ValueError(f"{path}: not a Dopamine baselines file (a list of "
                         "{Iteration, Value, Agent} entries)") from exc
    if not agents:
        raise ValueError(f"{path}: no entries")
    return agents


def summarize_dopamine(path: Path, last_step: int) -> dict[str, Any]:
    """Each agent's seeds at every SCORE_EVERY-step mark up to `last_step`: the mean score
    of the iteration that ends there."""
    marks = range(SCORE_EVERY, last_step + 1, SCORE_EVERY)
    agents = {}
    for agent, seeds in read_dopamine(path).items():
        at = {}
        for m in marks:
            ends_there = m // DOPAMINE_ITERATION - 1
            at[str(m)] = [round(seed[ends_there], 2) for seed in seeds if ends_there in seed]
        agents[agent] = {"seeds": len(seeds), "score_at": at,
                         "iterations": min(len(seed) for seed in seeds)}
    return {"game": path.stem, "agent_steps_per_iteration": DOPAMINE_ITERATION,
            "agents": agents}


def main_dopamine(s: Settings) -> dict[str, Any]:
    try:
        result = {"source": s.source, **summarize_dopamine(Path(s.dopamine), 2_500_000)}
    except (OSError, ValueError) as exc:
        raise SystemExit(f"bench.atari_reference: {exc}; --dopamine takes one game's "
                         "baselines/atari/data/<game>.json from google/dopamine") from exc
    marks = list(next(iter(result["agents"].values()))["score_at"])
    common.print_table(
        f"{result['game']} ({s.source}), sticky actions: mean (min to max) of the seeds",
        ["agent", "seeds"] + [f"{int(m) // 1000:,}k steps" for m in marks],
        [[agent, a["seeds"]] + [common.mean_span(a["score_at"][m]) for m in marks]
         for agent, a in result["agents"].items()])
    common.write_json(f"summary_atari_reference-{s.tag or 'dopamine'}", s, result)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if bool(s.monitors) == bool(s.dopamine):
        raise SystemExit("bench.atari_reference: give one of --monitors (an SB3 run's "
                         "folder) or --dopamine (a Dopamine baselines file)")
    if s.dopamine:
        return main_dopamine(s)
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
