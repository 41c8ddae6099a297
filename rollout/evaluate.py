"""A trained policy, loaded from a run by itself, and episodes played with it; and the
evaluator process that plays the learner's periodic snapshots.

`load_policy(run)` reads `model.safetensors` and the env and policy settings that travel
in its metadata (or, for older runs, the run's settings.json), rebuilds the network
without the user repeating any flag, and returns a `TrainedPolicy` whose `act` takes one
observation or a batch. `evaluate` plays whole episodes, sampled or deterministic, and
can record them as videos through gymnasium's RecordVideo (moviepy; `pip install
'hetrl[video]'`). No gRPC and no training here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import signal
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.wrappers import RecordVideo
from safetensors import safe_open
from safetensors.numpy import save_file

from hetrl.rollout.envs import describe_env, env_spec, in_space_dtype
from hetrl.rollout.errors import ConfigError, HetrlError
from hetrl.rollout.exits import EXIT_FAILED
from hetrl.rollout.lifetime import start_child
from hetrl.rollout.models import (
    BEST_CHOSEN_BY_EVALUATION,
    BEST_MODEL_FILE,
    best_info,
    model_file,
)
from hetrl.rollout.observations import batch_size, leaves, tree_map
from hetrl.rollout.policy import Policy, load_policy_arrays, policy_arrays
from hetrl.rollout.settings import (
    RESULTS_FILE,
    SNAPSHOT_GLOB,
    EnvSettings,
    EvaluatorSettings,
    PolicySettings,
    from_json,
)

log = logging.getLogger("hetrl.evaluate")

SETTINGS_KEY = "settings"  # safetensors metadata: the env and policy settings, as JSON


def model_metadata(settings: object) -> dict[str, str]:
    """What a saved model carries so that `load_policy` needs nothing else: the env and
    policy settings of `settings` (any settings class holding both), as JSON."""
    names = [f.name for cls in (EnvSettings, PolicySettings) for f in dataclasses.fields(cls)]
    return {SETTINGS_KEY: json.dumps({n: getattr(settings, n) for n in names})}


@dataclasses.dataclass
class TrainedPolicy:
    """A trained policy ready to act in its env (see `act`)."""

    policy: Policy
    env: EnvSettings
    settings: PolicySettings
    observation_space: gym.Space
    action_space: gym.Space
    metadata: dict[str, str]

    @property
    def recurrent(self) -> bool:
        """Whether the policy has a memory: then `act` takes and returns its state."""
        return self.policy.state_size > 0

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False, state: np.ndarray | None = None
            ) -> Any:
        """Actions as the env takes them (Box actions clipped and rescaled to its bounds).
        A recurrent policy (--recurrent) returns (actions, state): pass that state with
        the next observation, and None at an episode's start.

        Args:
            obs: one observation, shaped like the observation space, or a batch
                shaped (B, *observation_space.shape); for a Dict or Tuple space, the
                env's own dict or tuple (of one observation, or of batches with B
                first), or {path: array} of its leaves.
            deterministic: the most likely action (argmax, or the Gaussian's mean)
                instead of a sample.
            state: a recurrent policy's state from the previous call ([B, S], or [S]
                for one observation); None starts an episode.

        Returns:
            One action for one observation, or a batch of B actions; with a recurrent
            policy, and its new state.

        Raises:
            ValueError: obs has neither shape.
        """
        tree: Any
        if self.policy.obs_layout.nested:
            tree, single = self._leaves(obs)
        else:
            array = np.asarray(obs, dtype=self.observation_space.dtype)
            shape = tuple(self.observation_space.shape or ())
            single = array.shape == shape
            if not single and array.shape[1:] != shape:
                raise ValueError(f"act takes one observation of shape {shape} or a batch of "
                                 f"shape (B, {', '.join(map(str, shape))}); got {array.shape}")
            tree = array[None] if single else array
        obs_tensors = tree_map(torch.from_numpy, tree)
        new_state = None
        if self.recurrent:
            n = batch_size(tree)
            starts = torch.full((1, n), state is None)
            before = (torch.zeros(n, self.policy.state_size) if state is None
                      else torch.as_tensor(np.asarray(state, np.float32)).reshape(n, -1))
            dist, _, after = self.policy.sequence(obs_tensors, starts, before)
            new_state = after.numpy()[0] if single else after.numpy()
        else:
            dist, _ = self.policy(obs_tensors)
        raw = dist.mode() if deterministic else dist.sample()
        actions = in_space_dtype(self.policy.env_actions(raw.numpy()), self.action_space)
        chosen = actions[0] if single else actions
        return (chosen, new_state) if self.recurrent else chosen

    def _leaves(self, obs: Any) -> tuple[dict[str, np.ndarray], bool]:
        """A nested observation (or batch) as a batch of leaves in their dtypes, and
        whether it was one observation."""
        layout = self.policy.obs_layout
        if isinstance(obs, dict) and self.env.drop_observations:  # the env's own, unwrapped
            obs = {k: v for k, v in obs.items() if k not in self.env.drop_observations}
        tree = tree_map(np.asarray, layout.flatten(obs))
        single = layout.mismatch(tree) is None
        if not single:
            first = leaves(tree)[0]
            wrong = layout.mismatch(tree, first.shape[0] if first.ndim else -1)
            if wrong is not None:
                raise ValueError(f"act takes one observation of {self.observation_space} or "
                                 f"a batch of them (B first); got one {layout.mismatch(tree)}"
                                 f" (or as a batch, {wrong})")
        return ({leaf.name: (tree[leaf.name][None] if single else tree[leaf.name]
                             ).astype(leaf.dtype, copy=False) for leaf in layout.leaves},
                single)


def _settings_of(model: Path, metadata: dict[str, str]) -> dict[str, Any]:
    if SETTINGS_KEY in metadata:
        return json.loads(metadata[SETTINGS_KEY])
    saved = model.parent / "settings.json"  # runs saved before the metadata carried them
    if saved.is_file():
        return json.loads(saved.read_text())
    raise ConfigError(f"{model} carries no settings and there is no settings.json beside it; "
                      "which env and network it is for cannot be known")


def _build(cls: type, values: dict[str, Any]):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def describe_model(trained: TrainedPolicy) -> str:
    """Which policy this is, in a few words: 'the best policy (mean return 500.0 at step
    139,264, by training return)' or 'the final policy (step 300,032)'."""
    meta = trained.metadata
    step = int(meta.get("global_step", 0))
    if "best_mean_return" in meta:
        return (f"the best policy (mean return {float(meta['best_mean_return']):,.1f} at "
                f"step {step:,}, by {meta.get('best_chosen_by', 'training return')})")
    return f"the final policy (step {step:,})"


def load_policy(run: str | Path, which: str = "final") -> TrainedPolicy:
    """Load a run's trained policy.

    Args:
        run: the run directory (an emulated job's folder works too) or a model file.
        which: "final" (model.safetensors, where training ended) or "best"
            (model-best.safetensors: the best the run saw, by its training return, or
            by evaluation with --eval-every).

    Raises:
        ConfigError: no such model there, or it does not fit the network its settings
            describe.
        EnvError: the env it was trained on cannot be made here.
    """
    model = model_file(run, which)
    with safe_open(str(model), framework="numpy") as f:
        metadata = dict(f.metadata() or {})
        arrays = {name: f.get_tensor(name) for name in f.keys()}
    values = _settings_of(model, metadata)
    env, policy_settings = _build(EnvSettings, values), _build(PolicySettings, values)
    description = describe_env(env)
    policy = Policy(description.observation_space, description.action_space, policy_settings)
    try:
        load_policy_arrays(policy, arrays)
    except Exception as exc:
        raise ConfigError(f"{model} does not fit the network its settings describe: {exc}") \
            from exc
    policy.eval()
    return TrainedPolicy(policy, env, policy_settings, description.observation_space,
                         description.action_space, metadata)


@dataclasses.dataclass
class Evaluation:
    """Returns and lengths of whole episodes, and where their videos went."""

    returns: list[float]
    lengths: list[int]
    videos: list[Path]

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std_return(self) -> float:
        return float(np.std(self.returns))

    def summary(self) -> str:
        return (f"{len(self.returns)} episodes: return {self.mean_return:.2f} ± "
                f"{self.std_return:.2f}, length {np.mean(self.lengths):.1f} ± "
                f"{np.std(self.lengths):.1f}")


def evaluate(
    trained: TrainedPolicy, episodes: int = 10, deterministic: bool = False, seed: int = 0,
    video_dir: str | Path | None = None,
) -> Evaluation:
    """Play `episodes` whole episodes in a fresh env (episode i seeded seed + i).

    Raises:
        ConfigError: a video was asked for but the env cannot render frames, or moviepy
            is missing.
    """
    env = _make_env(trained.env, video_dir is not None)
    if video_dir is not None:
        try:
            # gymnasium names the files <prefix>-episode-<i>.mp4
            prefix = re.sub(r"[^A-Za-z0-9._-]+", "-", trained.env.env).strip("-.") or "env"
            env = RecordVideo(env, str(video_dir), episode_trigger=lambda _: True,
                              name_prefix=prefix, disable_logger=True)
        except gym.error.DependencyNotInstalled as exc:
            env.close()
            raise ConfigError(f"--video needs moviepy: pip install 'hetrl[video]' ({exc})") \
                from exc
    try:
        return _play(env, trained, episodes, deterministic, seed, video_dir)
    except gym.error.DependencyNotInstalled as exc:
        raise ConfigError(f"{trained.env.env} cannot render frames here: {exc}") from exc
    finally:
        env.close()


def _play(env: gym.Env, trained: TrainedPolicy, episodes: int, deterministic: bool,
          seed: int, video_dir: str | Path | None) -> Evaluation:
    returns, lengths = [], []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, steps, done, state = 0.0, 0, False, None
        while not done:
            if trained.recurrent:  # its memory carried through the episode
                action, state = trained.act(obs, deterministic, state)
            else:
                action = trained.act(obs, deterministic)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, steps = total + float(reward), steps + 1
            done = terminated or truncated
        returns.append(total)
        lengths.append(steps)
    env.close()  # RecordVideo writes the last episode's file on close
    videos = sorted(Path(video_dir).glob("*.mp4")) if video_dir is not None else []
    return Evaluation(returns, lengths, videos)


def _make_env(settings: EnvSettings, frames: bool) -> gym.Env:
    spec = env_spec(settings)
    if not frames:
        return gym.make(spec)
    try:
        env = gym.make(spec, render_mode="rgb_array")
    except TypeError as exc:
        raise ConfigError(f"{settings.env} does not take render_mode='rgb_array', so no "
                          f"video can be recorded: {exc}") from exc
    if env.render_mode != "rgb_array":
        env.close()
        raise ConfigError(f"{settings.env} cannot render rgb_array frames; no video")
    return env


def run_evaluator(settings: EvaluatorSettings, stop: threading.Event | None = None) -> int:
    """Evaluate each new snapshot in settings.eval_dir (the newest only, when several
    wait: a slow evaluation never builds a backlog), deterministically, and append the
    result to results.jsonl there; until `stop` is set or the process is signalled."""
    stop = stop or threading.Event()
    folder = Path(settings.eval_dir)
    folder.mkdir(parents=True, exist_ok=True)
    best_path = folder.parent / BEST_MODEL_FILE
    previous = best_info(best_path)
    best = (previous["mean_return"] if previous is not None
            and previous["chosen_by"] == BEST_CHOSEN_BY_EVALUATION else -math.inf)
    while not stop.is_set():
        snapshots = sorted(folder.glob(SNAPSHOT_GLOB))
        if not snapshots:
            stop.wait(0.25)
            continue
        for skipped in snapshots[:-1]:
            skipped.unlink(missing_ok=True)
        newest = snapshots[-1]
        trained = load_policy(newest)
        result = evaluate(trained, settings.eval_episodes, deterministic=settings.deterministic,
                          seed=settings.seed)
        record = {"global_step": int(trained.metadata.get("global_step", 0)),
                  "eval_return": result.mean_return, "eval_return_std": result.std_return,
                  "eval_length": float(np.mean(result.lengths)),
                  "episodes": len(result.returns), "deterministic": settings.deterministic}
        with (folder / RESULTS_FILE).open("a") as f:
            f.write(json.dumps(record) + "\n")
        if result.mean_return > best:  # ties keep the earlier policy
            best = result.mean_return
            _keep_best(trained, best_path, result.mean_return)
        newest.unlink(missing_ok=True)
        log.info("evaluated step %d: %s", record["global_step"], result.summary())
    return 0


def _keep_best(trained: TrainedPolicy, path: Path, mean_return: float) -> None:
    """Write the policy just evaluated as the run's best (whole or not at all)."""
    metadata = {**trained.metadata, "best_mean_return": repr(mean_return),
                "best_chosen_by": BEST_CHOSEN_BY_EVALUATION}
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save_file(policy_arrays(trained.policy), str(tmp), metadata=metadata)
        tmp.replace(path)
    except OSError as exc:  # the evaluation is recorded; only the copy is missing
        tmp.unlink(missing_ok=True)
        log.warning("could not keep the best policy in %s: %s", path, exc)


def main(argv: list[str] | None = None) -> int:
    """`python -m hetrl.rollout.evaluate SETTINGS_JSON`: the launcher's evaluator."""
    settings_file = start_child(argv)
    torch.set_num_threads(1)
    stop = threading.Event()

    def on_signal(_signum, _frame):  # stop now, even mid-evaluation: results are per line
        stop.set()
        raise SystemExit(0)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    try:
        return run_evaluator(from_json(EvaluatorSettings, settings_file.read_text()), stop)
    except HetrlError as exc:
        log.error("%s", exc)
        return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
