"""Atari preprocessing order: what the policy sees through hetrl's Atari pipeline against
CleanRL's ppo_atari wrappers, on the same emulator frames.

hetrl's pipeline is gymnasium's AtariPreprocessing (rollout/atari.py): each emulator
frame's grayscale screen as ALE gives it, the last two frames of an agent step
max-pooled, then an area resize to 84x84. CleanRL's wrappers (SB3's MaxAndSkipEnv,
gymnasium's ResizeObservation and a grayscale conversion) max-pool the last two colour
frames, area-resize the colour frame, then convert it with OpenCV's RGB-to-gray weights.
Resize and grayscale are both linear, so the two orders should differ in rounding, in
the grayscale weights and in where the pooling happens; this measures by how much, and
whether the ball, the smallest thing on the screen, shows as clearly in both.

One env runs hetrl's own pipeline (`env_spec`, as a worker builds it) with random
actions, and a wrapper below AtariPreprocessing keeps each emulator frame's colour
screen, from which the other images of the same step are built: CleanRL's; hetrl's order
rebuilt in OpenCV (which checks that ALE's grayscale is OpenCV's); CleanRL's with the
grayscale before the resize (the order alone); and, as a control that shows what a real
difference reads, CleanRL's image of the step before. Per agent step: the mean and the
largest absolute pixel difference and the correlation of two images; on the steps where
the ball is on the field (its colour, rows 34-193), its contrast: the brightest pixel
within one of the ball's place in the 84x84 image, less the field's median (Pong only;
another game gets the image figures). Run:
`python -m bench.atari_preprocess [--quick] [--env ALE/Game-v5]`; record
bench/results/summary_atari_preprocess.json (docs/atari.md's table; another game:
summary_atari_preprocess-ALE-Game-v5.json).
"""

from __future__ import annotations

import dataclasses

import cv2
import gymnasium as gym
import numpy as np
import tyro
from gymnasium.envs.registration import EnvSpec, WrapperSpec

from bench import common
from hetrl.rollout.envs import env_spec
from hetrl.rollout.settings import EnvSettings

BALL_RGB = (236, 236, 236)
FIELD_ROWS = (34, 194)
"""Pong's playing field in the 210-row screen: between the walls, which share the ball's
colour."""


@dataclasses.dataclass
class Settings:
    """hetrl's Atari image against CleanRL's, on the same frames."""

    env: str = "ALE/Pong-v5"
    steps: int = 3000
    """Agent steps (4 emulator frames each) of random play."""
    seed: int = 1
    quick: bool = False
    """200 steps."""


class ColourFrames(gym.Wrapper):
    """Keeps the colour screen of every emulator frame since the last agent step (it sits
    below AtariPreprocessing, which steps it frame by frame)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.frames: list[np.ndarray] = []

    def _keep(self) -> None:
        self.frames.append(self.env.unwrapped.ale.getScreenRGB())  # type: ignore[attr-defined]

    def reset(self, **kwargs):
        out = self.env.reset(**kwargs)
        self.frames = []
        self._keep()
        return out

    def step(self, action):
        out = self.env.step(action)
        self._keep()
        return out


def max_pool(last_two: list[np.ndarray]) -> np.ndarray:
    """The pixelwise max of an agent step's last two frames (its only one after a reset)."""
    return np.maximum(*last_two) if len(last_two) == 2 else last_two[-1]


def cleanrl_image(pooled: np.ndarray, size: int, gray_first: bool = False) -> np.ndarray:
    """CleanRL's image of an agent step from its max-pooled colour frame: area-resized,
    then OpenCV's grayscale (or grayscale before the resize)."""
    if gray_first:
        gray = cv2.cvtColor(pooled, cv2.COLOR_RGB2GRAY)
        return cv2.resize(gray, (size, size), interpolation=cv2.INTER_AREA)
    small = cv2.resize(pooled, (size, size), interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(small, cv2.COLOR_RGB2GRAY)


def gray_pooled_image(last_two: list[np.ndarray], size: int) -> np.ndarray:
    """hetrl's order, rebuilt in OpenCV from the colour frames: each frame to grayscale,
    the two max-pooled, then the area resize."""
    pooled = max_pool([cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY) for frame in last_two])
    return cv2.resize(pooled, (size, size), interpolation=cv2.INTER_AREA)


def ball_contrast(image: np.ndarray, ball: tuple[float, float], screen: tuple[int, int]
                  ) -> float:
    """The brightest pixel within one of the ball's place (`ball`: row, column in the
    `screen`'s pixels) in `image`, less the median of the field's rows."""
    size = image.shape[0]
    row = int(ball[0] * size / screen[0])
    col = int(ball[1] * size / screen[1])
    window = image[max(row - 1, 0):row + 2, max(col - 1, 0):col + 2]
    top = int(FIELD_ROWS[0] * size / screen[0]) + 1
    bottom = int(FIELD_ROWS[1] * size / screen[0]) - 1
    return float(window.max()) - float(np.median(image[top:bottom]))


def ball_place(frame: np.ndarray) -> tuple[float, float] | None:
    """The ball's centre (row, column) in a colour screen, or None off the field."""
    field = frame[FIELD_ROWS[0]:FIELD_ROWS[1]]
    rows, cols = np.nonzero((field == BALL_RGB).all(axis=-1))
    if not len(rows):
        return None
    return FIELD_ROWS[0] + float(rows.mean()) + 0.5, float(cols.mean()) + 0.5


def _compare(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(mean absolute difference, largest absolute difference, correlation) of two
    uint8 images."""
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    corr = float(np.corrcoef(x, y)[0, 1]) if x.std() and y.std() else 1.0
    diff = np.abs(x - y)
    return float(diff.mean()), float(diff.max()), corr


def _spread(values) -> dict[str, float]:
    """Mean, min and max of per-step figures (thousands of them: no raw values)."""
    values = np.asarray(list(values), dtype=np.float64)
    return {"mean": float(values.mean()), "min": float(values.min()),
            "max": float(values.max()), "n": int(len(values))}


def _shown(stat: dict[str, float], spec: str) -> str:
    return f"{stat['mean']:{spec}} [{stat['min']:{spec}}-{stat['max']:{spec}}]"


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, steps=200)
    settings = EnvSettings(env=s.env, atari=True)
    spec = env_spec(settings)  # hetrl's pipeline, as a worker makes it
    assert isinstance(spec, EnvSpec)
    wrappers = list(spec.additional_wrappers)
    first = next(i for i, w in enumerate(wrappers) if w.name == "AtariPreprocessing")
    wrappers.insert(first, WrapperSpec(ColourFrames.__name__,
                                       f"{ColourFrames.__module__}:{ColourFrames.__name__}", {}))
    spec = dataclasses.replace(spec, additional_wrappers=tuple(wrappers))
    size = settings.atari_screen_size
    env = gym.make(spec)
    recorder = next(w for w in _wrappers(env) if isinstance(w, ColourFrames))
    pairs: dict[str, list[tuple[float, float, float]]] = {
        "hetrl vs CleanRL": [],
        "hetrl vs its order in OpenCV (gray, pool, resize)": [],
        "CleanRL: gray before vs after the resize": [],
        "control: hetrl vs CleanRL a step earlier": []}
    earlier = None
    pong = "Pong" in s.env  # the ball's colour and the field's rows are Pong's
    contrast: dict[str, list[float]] = {"hetrl": [], "CleanRL": []}
    obs, _ = env.reset(seed=s.seed)
    env.action_space.seed(s.seed)
    try:
        for _ in range(s.steps):
            recorder.frames = []
            obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                obs, _ = env.reset()
                earlier = None
                continue
            frames = recorder.frames[-2:]
            pooled = max_pool(frames)
            ours = np.asarray(obs)[-1]
            theirs = cleanrl_image(pooled, size)
            pairs["hetrl vs CleanRL"].append(_compare(ours, theirs))
            pairs["hetrl vs its order in OpenCV (gray, pool, resize)"].append(
                _compare(ours, gray_pooled_image(frames, size)))
            pairs["CleanRL: gray before vs after the resize"].append(
                _compare(cleanrl_image(pooled, size, gray_first=True), theirs))
            if earlier is not None:  # what a real difference (one step of motion) reads
                pairs["control: hetrl vs CleanRL a step earlier"].append(
                    _compare(ours, earlier))
            earlier = theirs
            ball = ball_place(pooled) if pong else None
            if ball is not None:
                screen = pooled.shape[:2]
                contrast["hetrl"].append(ball_contrast(ours, ball, screen))
                contrast["CleanRL"].append(ball_contrast(theirs, ball, screen))
    finally:
        env.close()
    results: dict = {"steps": s.steps, "ball_steps": len(contrast["hetrl"])}
    for name, values in pairs.items():
        diffs, largest, corrs = zip(*values, strict=True)
        results[name] = {"mean_abs_diff": _spread(diffs), "max_abs_diff": _spread(largest),
                         "correlation": _spread(corrs)}
    for name, values in contrast.items():
        results[f"ball_contrast_{name}"] = _spread(values) if values else None
        results[f"ball_shown_{name}"] = (float(np.mean(np.asarray(values) >= 10))
                                         if values else None)
    common.print_table(
        f"{s.env}, {s.steps} random agent steps, the 84x84 images of the same frames "
        "(mean [min-max] over steps)",
        ["compared", "mean |difference| (levels)", "largest |difference|", "correlation"],
        [[name, _shown(results[name]["mean_abs_diff"], ".3f"),
          _shown(results[name]["max_abs_diff"], ".0f"),
          _shown(results[name]["correlation"], ".4f")] for name in pairs])
    if pong:
        _print_ball(results)
    game = "" if s.env == Settings.env else "-" + s.env.replace("/", "-")  # Pong's is kept
    common.write_json(f"summary_atari_preprocess{game}", s, results)
    return results


def _print_ball(results: dict) -> None:
    contrast = ("hetrl", "CleanRL")
    common.print_table(
        f"The ball against the field, on the {results['ball_steps']} steps it is in play "
        "(pixel levels; shown: >= 10 levels above the field)",
        ["pipeline", "contrast", "shown"],
        [[name, "-" if results[f"ball_contrast_{name}"] is None
          else _shown(results[f"ball_contrast_{name}"], ".1f"),
          "-" if results[f"ball_shown_{name}"] is None
          else f"{100 * results[f'ball_shown_{name}']:.1f}%"] for name in contrast])


def _wrappers(env: gym.Env):
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


if __name__ == "__main__":
    main()
