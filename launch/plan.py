"""`hetrl plan`: how many env hosts saturate the learner, and what that costs.

It measures what one core does here with the real env and policy (a worker's vector env
and CPU policy stepping whole fragments on one torch thread), takes the learner's
capacity in env steps per second (given, read from a previous run's summary, or
measured here on this CPU), and prints, for 0, 1, 2, ... env hosts of the chosen type
beside the learner instance: expected env steps/s, $/hour, $ per million env steps
(on-demand and spot), learner utilisation, and the gain over the homogeneous baseline
(the learner instance alone, its spare vCPUs running workers). A second table sizes a
learner group: for 1, 2, 4, ... learner instances (one rank per GPU), the group's update
ceiling, the env hosts that feed it and the cost of each option. This is the arithmetic
AWS asks users to do by hand. It starts no cluster and sends nothing anywhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from hetrl.launch.prices import cost_per_million_steps, load_prices
from hetrl.launch.settings import InstanceTypes
from hetrl.rollout.errors import ConfigError
from hetrl.rollout.settings import EnvSettings, PolicySettings, RolloutSettings, require


@dataclasses.dataclass
class PlanSettings(InstanceTypes, EnvSettings, PolicySettings, RolloutSettings):
    """`hetrl plan`: size a heterogeneous job for an env before paying for it."""

    learner_samples_per_second: float = 0.0
    """Env steps per second the learner can train on; 0: read --from-run, else measure
    here on this CPU (a GPU learner is faster, so that figure is a floor)."""
    from_run: str = ""
    """A previous run directory: its summary gives the learner's samples per second."""
    learner_cores: int = 2
    """vCPUs of the learner host kept for the learner (the rest run workers)."""
    measure_seconds: float = 5.0
    """Seconds spent measuring the env's steps per second on one core."""
    max_env_hosts: int = 32
    """Largest number of env hosts the table considers."""
    max_learner_count: int = 4
    """Largest learner group (learner instances) the learner-group table considers."""
    prices: str = ""
    """A JSON price file overriding the shipped table (same format as prices.json), or
    `live` / `live:REGION` for current prices from the AWS Price List API (needs AWS
    credentials; cached a day; the shipped table, with a line saying so, without)."""

    def __post_init__(self) -> None:
        require(self.learner_samples_per_second >= 0, "--learner-samples-per-second must be >= 0")
        require(self.measure_seconds > 0, "--measure-seconds must be > 0")
        require(self.max_env_hosts >= 1, "--max-env-hosts must be >= 1")
        require(self.max_learner_count >= 1, "--max-learner-count must be >= 1")
        require(self.learner_cores >= 0, "--learner-cores must be >= 0")
        super().__post_init__()


def measure_core_rate(settings: PlanSettings) -> float:
    """Env steps per second of one worker on one core (policy inference included): per
    second of this thread's CPU time when the envs step in it (synchronous vector envs),
    so a busy machine does not read as a slow core; else per second of wall time."""
    import gymnasium as gym  # here, not at the top: the CLI imports this module for its
    import torch  # settings

    from hetrl.rollout.collector import Collector
    from hetrl.rollout.envs import make_vector_env
    from hetrl.rollout.policy import Policy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    envs = make_vector_env(settings, settings.envs_per_worker, settings.vector_mode)
    try:
        policy = Policy(envs.single_observation_space, envs.single_action_space, settings)
        collector = Collector(envs, policy, settings.fragment_length, settings.seed)
        collector.collect()  # warm-up: first resets, lazy imports, allocator
        clock = (time.thread_time if isinstance(envs, gym.vector.SyncVectorEnv)
                 else time.perf_counter)
        steps, start, used = 0, time.perf_counter(), clock()
        while time.perf_counter() - start < settings.measure_seconds:
            steps += collector.collect().rewards.size
        return steps / (clock() - used)
    finally:
        envs.close()
        torch.set_num_threads(threads)


def learner_rate_from_run(path: Path) -> float:
    """Env steps per second of training time in a previous run."""
    summary = json.loads((path / "summary.json").read_text())
    train = float(summary.get("learner_train_seconds") or 0)
    if train <= 0:
        raise ConfigError(f"{path}/summary.json has no training time to measure the learner by")
    return float(summary["global_step"]) / train


def group_efficiency_from_run(path: Path) -> float | None:
    """How much of a learner group's update ceiling the all-reduces leave, from a group
    run's summary (1 - all-reduce seconds / update seconds); None for a run of one rank."""
    summary = json.loads((path / "summary.json").read_text())
    group = summary.get("learner_group")
    updates = float(summary.get("policy_version") or 0)
    train = float(summary.get("learner_train_seconds") or 0)
    if not group or updates <= 0 or train <= 0:
        return None
    return max(0.0, 1.0 - float(group["allreduce_seconds_per_update"]) / (train / updates))


def learner_train_settings(description):
    """The PPO settings a run of this env (`describe_env`'s description) trains with:
    its preset's (continuous: 10 x 32 minibatches per 2,048 steps, several times the
    shipped defaults' 4 x 4 update)."""
    from hetrl.launch.presets import apply_preset, preset_for
    from hetrl.learner.settings import TrainSettings

    name, _ = preset_for(description.observation_space, description.action_space,
                         description.ale)
    return apply_preset(TrainSettings(preset=name), explicit=())[0]


def measure_learner_rate(settings: PlanSettings, seconds: float = 3.0) -> float:
    """Env steps per second the learner trains on here (this CPU), with the settings of
    the env's preset."""
    import torch

    from hetrl.rollout.envs import describe_env

    d = describe_env(settings)
    train = learner_train_settings(d)
    threads = torch.get_num_threads()
    torch.set_num_threads(train.learner_torch_threads)  # as the learner process runs
    try:
        return _time_updates(settings, d, train, seconds)
    finally:
        torch.set_num_threads(threads)


def _time_updates(settings: PlanSettings, d, train, seconds: float) -> float:
    import numpy as np
    import torch

    from hetrl.learner.optimizer import PolicyAdam
    from hetrl.learner.ppo import Batch, ppo_update
    from hetrl.rollout.observations import tree_map
    from hetrl.rollout.policy import Policy

    policy = Policy(d.observation_space, d.action_space, settings)
    optimizer = PolicyAdam(policy, train.learning_rate)
    t_len = settings.fragment_length
    # The batch two workers get (auto: more workers, bigger batches).
    n = settings.envs_per_worker * train.batch_fragments(2)
    rng = np.random.default_rng(0)
    obs = policy.obs_layout.sample(d.observation_space, (t_len + 1) * n)
    # as the policy samples them (flat, no offset)
    actions, _ = policy.act(tree_map(lambda o: o[:t_len * n], obs))
    # a recurrent policy replays each env's sequence from its state
    memory: dict[str, Any] = ({"starts": torch.zeros(t_len + 1, n, dtype=torch.bool),
                               "initial_state": torch.zeros(1, n, policy.state_size)}
                              if policy.state_size else {})
    batch = Batch(
        observations=tree_map(
            lambda o: torch.from_numpy(o.reshape(t_len + 1, n, *o.shape[1:])), obs),
        actions=torch.from_numpy(actions.reshape(t_len, n, *actions.shape[1:])),
        logprobs=torch.full((t_len, n), -0.7),
        rewards=torch.from_numpy(rng.normal(size=(t_len, n)).astype(np.float32)),
        terminated=torch.zeros(t_len, n, dtype=torch.bool),
        truncated=torch.zeros(t_len, n, dtype=torch.bool),
        valid=torch.ones(t_len, n, dtype=torch.bool),
        **memory,
    )
    ppo_update(policy, optimizer, batch, train)  # warm-up
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        ppo_update(policy, optimizer, batch, train)
        updates += 1
    return updates * t_len * n / (time.perf_counter() - start)


@dataclasses.dataclass(frozen=True)
class PlanRow:
    env_hosts: int
    env_steps_per_second: float
    learner_busy: float
    price_per_hour: float
    cost_per_million: float
    spot_cost_per_million: float
    gain: float  # fraction cheaper per env step than the homogeneous baseline


def group_ceiling(learner_rate: float, ranks: int, efficiency: float) -> float:
    """Env steps per second a learner group of `ranks` trains on: each rank's rate,
    less the share its gradient all-reduces take (none for one rank)."""
    return learner_rate * ranks * (efficiency if ranks > 1 else 1.0)


def plan_rows(core_rate: float, learner_rate: float, settings: PlanSettings,
              efficiency: float = 1.0) -> list[PlanRow]:
    """Rows for 0 (homogeneous) .. N env hosts, up to one past saturating the learner
    (--learner-count instances of it: a group, one rank per GPU)."""
    prices = load_prices(settings.prices or None)
    learner, env = prices.get(settings.learner_type), prices.get(settings.env_type)
    count = settings.learner_count
    spare = count * max(0, learner.vcpus - settings.learner_cores)
    learner_rate = group_ceiling(learner_rate, count * max(1, learner.gpus), efficiency)
    rows: list[PlanRow] = []
    for k in range(settings.max_env_hosts + 1):
        produced = core_rate * (spare + k * env.vcpus)
        rate = min(produced, learner_rate)
        price = count * learner.price_per_hour + k * env.price_per_hour
        cost = cost_per_million_steps(price, rate)
        base = rows[0].cost_per_million if rows else cost
        rows.append(PlanRow(k, rate, rate / learner_rate, price, cost,
                            cost * (1 - prices.spot_discount),
                            1 - cost / base if math.isfinite(base) and base > 0 else 0.0))
        if produced >= learner_rate and k >= 1:
            break
    return rows


@dataclasses.dataclass(frozen=True)
class GroupOption:
    """One size of learner group and the env hosts that keep it busy."""

    learner_count: int
    ranks: int
    ceiling: float
    env_hosts: int | None  # None: more than --max-env-hosts would be needed
    price_per_hour: float
    cost_per_million: float


def group_options(core_rate: float, learner_rate: float, settings: PlanSettings,
                  efficiency: float) -> list[GroupOption]:
    """For 1, 2, 4, ... learner instances (up to --max-learner-count): the group's
    update ceiling, the fewest env hosts whose workers (with the learner hosts' spare
    vCPUs) reach it, and what that job costs per hour and per million env steps."""
    prices = load_prices(settings.prices or None)
    learner, env = prices.get(settings.learner_type), prices.get(settings.env_type)
    options = []
    count = 1
    while count <= settings.max_learner_count:
        ranks = count * max(1, learner.gpus)
        ceiling = group_ceiling(learner_rate, ranks, efficiency)
        spare = count * max(0, learner.vcpus - settings.learner_cores) * core_rate
        needed = max(0, math.ceil((ceiling - spare) / max(core_rate * env.vcpus, 1e-9)))
        hosts = needed if needed <= settings.max_env_hosts else None
        fed = min(ceiling, spare + core_rate * env.vcpus * (hosts if hosts is not None
                                                            else settings.max_env_hosts))
        price = count * learner.price_per_hour + (hosts or settings.max_env_hosts) * \
            env.price_per_hour
        options.append(GroupOption(count, ranks, ceiling, hosts, price,
                                   cost_per_million_steps(price, fed)))
        count *= 2
    return options


def run_plan(settings: PlanSettings) -> str:
    """Measure, compute and format the plan."""
    from hetrl.launch.placement import measure_placement

    core_rate = measure_core_rate(settings)
    placement = measure_placement(settings, seconds=min(1.0, settings.measure_seconds))
    efficiency = (group_efficiency_from_run(Path(settings.from_run))
                  if settings.from_run else None)
    if settings.learner_samples_per_second > 0:
        learner_rate, source = settings.learner_samples_per_second, "given"
    elif settings.from_run:
        learner_rate = learner_rate_from_run(Path(settings.from_run))
        if efficiency is not None:  # a group run's rate is the group's: one rank's is less
            summary = json.loads((Path(settings.from_run) / "summary.json").read_text())
            learner_rate /= summary["learner_group"]["ranks"] * efficiency
        source = f"from {settings.from_run}"
    else:
        learner_rate = measure_learner_rate(settings)
        source = "measured on this CPU (a GPU learner is faster: pass the GPU figure)"
    rows = plan_rows(core_rate, learner_rate, settings, efficiency or 1.0)
    best = min(rows, key=lambda r: r.cost_per_million)
    saturating = next((r for r in rows if r.learner_busy >= 0.999), None)
    lines = [
        f"env {settings.env}: {core_rate:,.0f} env steps/s per core "
        f"({settings.envs_per_worker} envs x {settings.fragment_length} steps per fragment)",
        f"learner {settings.learner_type}: {learner_rate:,.0f} env steps/s ({source})",
        "",
        f"{'env hosts':>20} {'env steps/s':>12} {'learner busy':>12} {'$/hour':>8} "
        f"{'$/M steps':>10} {'spot $/M':>9} {'vs homog.':>9}",
    ]
    for r in rows:
        label = f"{r.env_hosts} x {settings.env_type}" if r.env_hosts else "homogeneous"
        lines.append(
            f"{label:>20} {r.env_steps_per_second:>12,.0f} {r.learner_busy:>12.0%} "
            f"{r.price_per_hour:>8.3f} {r.cost_per_million:>10.4f} "
            f"{r.spot_cost_per_million:>9.4f} {r.gain:>+9.0%}"
        )
    lines.append("")
    if saturating is not None and saturating.env_hosts == 0:
        lines.append(f"the {settings.learner_type} alone saturates its learner with its own "
                     "vCPUs: env hosts would not pay for themselves with this env.")
    elif saturating is not None:
        lines.append(f"{saturating.env_hosts} env host(s) of {settings.env_type} saturate the "
                     f"learner; cheapest per env step: {best.env_hosts} env host(s) "
                     f"({best.gain:+.0%} vs the learner instance alone).")
    else:
        lines.append(f"even {settings.max_env_hosts} env hosts do not saturate the learner: "
                     "the env is the bottleneck; raise --max-env-hosts or pick bigger hosts.")
    lines += ["", *group_lines(core_rate, learner_rate, settings, efficiency)]
    lines += ["", *placement.lines()]
    if placement.choice() == "central":
        central_rows = plan_rows(placement.central_env_host_rate(), learner_rate, settings)
        cheapest = min(central_rows, key=lambda r: r.cost_per_million)
        lines.append(f"with --inference central: {cheapest.env_steps_per_second:,.0f} env "
                     f"steps/s at ${cheapest.cost_per_million:.4f} per million steps with "
                     f"{cheapest.env_hosts} env host(s) (the table above is worker inference; "
                     f"${best.cost_per_million:.4f} there)")
    return "\n".join(lines)


def group_lines(core_rate: float, learner_rate: float, settings: PlanSettings,
                efficiency: float | None) -> list[str]:
    """The learner-group table: how many learner instances for how many env hosts."""
    known = efficiency is not None
    options = group_options(core_rate, learner_rate, settings, efficiency or 1.0)
    lines = [
        f"learner group (--learner-count; one rank per GPU of {settings.learner_type}), "
        + (f"all-reduces leaving {efficiency:.0%} of each rank's rate (from {settings.from_run})"
           if known else "each rank at its full rate: the all-reduce cost is not counted "
           "(--from-run of a group run measures it)"),
        f"{'learners':>9} {'ranks':>6} {'update ceiling':>15} {'env hosts':>10} {'$/hour':>8} "
        f"{'$/M steps':>10}",
    ]
    for o in options:
        hosts = str(o.env_hosts) if o.env_hosts is not None else f">{settings.max_env_hosts}"
        lines.append(f"{o.learner_count:>9} {o.ranks:>6} {o.ceiling:>15,.0f} {hosts:>10} "
                     f"{o.price_per_hour:>8.3f} {o.cost_per_million:>10.4f}")
    cheapest = min(options, key=lambda o: o.cost_per_million)
    lines.append(f"cheapest per env step: {cheapest.learner_count} learner instance(s) with "
                 f"{cheapest.env_hosts if cheapest.env_hosts is not None else 'more than '}"
                 f"{'' if cheapest.env_hosts is not None else settings.max_env_hosts} "
                 "env host(s); a bigger group trains faster (its ceiling), not cheaper: "
                 "pick the smallest one that is as fast as you need")
    return lines
