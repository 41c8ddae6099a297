"""Resolve the user's environment the same way in every process, and make vector envs.

`--env` is either a registered gymnasium id or an entry point `pkg.mod:Class`;
`--env-import` modules are imported first so they can register ids. The learner calls
`describe_env` to learn the spaces and to fail before anything is spawned; workers call
`make_vector_env`, which wraps every sub-env in an `EnvGuard` (sync and async modes):
an env that raises or returns NaN/Inf is recreated inside its own slot and reports the
fault through `info`, so one broken simulator never leaves the vector env in an unknown
state. Gymnasium 1.x NEXT_STEP autoreset is required: the collector's bookkeeping
depends on it. Nothing here touches torch or the network.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import functools
import importlib
import logging
import os
import traceback
from collections.abc import Callable
from types import ModuleType

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec, WrapperSpec, find_highest_version, parse_env_id
from gymnasium.utils import RecordConstructorArgs
from gymnasium.vector import AutoresetMode

from hetrl.rollout.atari import atari_spec, is_ale
from hetrl.rollout.errors import EnvError, EnvShapeError, EnvUnhealthyError, NonFiniteError
from hetrl.rollout.observations import ObsLayout, all_finite
from hetrl.rollout.settings import EnvSettings

log = logging.getLogger("hetrl.envs")

# Key of the fault marker an EnvGuard puts in a step's info, and its values.
FAULT_KEY = "hetrl_fault"
FAULT_ERROR, FAULT_NONFINITE = 1, 2


@dataclasses.dataclass(frozen=True)
class EnvDescription:
    """What the learner needs to know about an env without stepping it."""

    observation_space: gym.Space
    """A Box, or a Dict or Tuple of supported leaves (`ObsLayout`)."""
    action_space: gym.spaces.Space
    ale: bool = False
    """Made by ale-py's AtariEnv (an Atari game: the atari preset's env)."""


_CHOICE_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def action_dtype(action_space: gym.Space) -> np.dtype:
    """The dtype actions are sampled, trained and sent in: int64 for choices (Discrete,
    MultiDiscrete, MultiBinary), float32 for Box."""
    return np.dtype(np.int64) if isinstance(action_space, _CHOICE_SPACES) else np.dtype("<f4")


def in_space_dtype(actions: np.ndarray, action_space: gym.Space) -> np.ndarray:
    """Env actions in the dtype their space declares (an int32 MultiDiscrete, an int8
    MultiBinary, an integer Box rounded), so an env that checks `action_space.contains`
    accepts them; hetrl samples and sends int64 or float32."""
    dtype = np.dtype(action_space.dtype) if action_space.dtype is not None else None
    if dtype is None or actions.dtype == dtype:
        return actions
    if dtype.kind in "iub" and actions.dtype.kind == "f":
        actions = np.rint(actions)
    return actions.astype(dtype)


def action_shape(action_space: gym.Space) -> tuple[int, ...]:
    """The shape of one action as the policy samples it and fragments carry it: () for
    Discrete, else flat (a Box (2, 3) is 6 numbers, a MultiDiscrete of nvec [[3, 3],
    [3, 3]] 4 choices); `Policy.env_actions` gives the env back its own shape."""
    if isinstance(action_space, gym.spaces.Discrete):
        return ()
    return (int(np.prod(action_space.shape or ())),)

def import_user_module(name: str, flag: str, error: type[Exception] = EnvError) -> ModuleType:
    """Import a user's module the way `python -m` would find it: installed packages first,
    then the current directory (hetrl's children get it last on their path).

    Raises:
        error: the import failed; the message names the flag and where hetrl looked.
    """
    try:
        return importlib.import_module(name)
    except Exception as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name and name.startswith(exc.name):
            hint = (f" hetrl looks for {exc.name!r} among installed packages, then in the "
                    f"current directory ({os.getcwd()}) and PYTHONPATH: run from the folder "
                    f"that holds {exc.name.split('.')[0]}/, or pip install it.")
        raise error(f"{flag}: cannot import {name} ({exc!r}).{hint}") from exc


def _import_modules(names: tuple[str, ...]) -> None:
    for name in names:
        import_user_module(name, "--env-import")  # registers its ids


# Env ids that a package registers when it is imported: (id prefix, module, what to
# install). `--env ALE/Pong-v5` then needs no --env-import, in every process that makes
# the env (workers, env servers, the learner, enjoy, every host of a job).
REGISTERING_PACKAGES = (
    ("ALE/", "ale_py", "pip install 'hetrl[atari]' (ale-py)"),
    ("MiniGrid-", "minigrid", "pip install minigrid"),
    ("BabyAI-", "minigrid", "pip install minigrid"),
)


def _import_registering_package(env: str) -> None:
    """Import the package that registers `env`'s id, when a known one does and the id
    is not registered yet.

    Raises:
        EnvError: that package is not installed; the message says what to install.
    """
    if ":" in env or _registered(env):
        return
    for prefix, module, install in REGISTERING_PACKAGES:
        if not env.startswith(prefix):
            continue
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] != module:
                raise
            raise EnvError(f"--env {env}: {prefix}* ids are registered by the {module} "
                           f"package, which is not installed here: {install}") from exc
        return


def env_spec(settings: EnvSettings) -> str | EnvSpec:
    """The id or EnvSpec to hand to gymnasium for `--env` (an EnvSpec with the Atari
    pipeline under `--atari`, or that drops observation keys when `--drop-observations`
    asks).

    Raises:
        EnvError: an `--env-import` or `--env` module cannot be imported, `--env
            module:Name` names neither a callable of the module nor an env id it
            registers, an ALE/* id without ale-py, or `--atari` on an env that is not ALE.
    """
    _import_modules(settings.env_import)
    _import_registering_package(settings.env)
    spec: str | EnvSpec = settings.env
    if ":" in settings.env:
        module_name, _, attr = settings.env.partition(":")
        module = import_user_module(module_name, f"--env {settings.env!r}")
        target = getattr(module, attr, None)
        if callable(target):  # pkg.mod:Class (or a factory function)
            spec = EnvSpec(id=settings.env, entry_point=settings.env)
        # Otherwise gymnasium's own "module:EnvId" form: importing the module registered
        # EnvId (gymnasium reports a bad id that is no Python name, e.g. ns/Name-v0).
        elif attr.isidentifier() and not _registered(attr):
            raise _no_such_env(settings.env, module, attr, target)
    if getattr(settings, "atari", False):
        spec = atari_spec(_as_spec(spec), settings)
    keys = getattr(settings, "drop_observations", ())
    if not keys:
        return spec
    spec = _as_spec(spec)
    drop = WrapperSpec(DropObservations.__name__,
                       f"{DropObservations.__module__}:{DropObservations.__name__}",
                       {"keys": list(keys)})
    return dataclasses.replace(spec, additional_wrappers=(*spec.additional_wrappers, drop))


def is_ale_env(settings: EnvSettings) -> bool:
    """Whether `--env` is made by ale-py's AtariEnv (what `--atari` needs).

    Raises:
        EnvError: as env_spec.
    """
    return is_ale(_as_spec(env_spec(dataclasses.replace(settings, atari=False,
                                                         drop_observations=()))))


def _as_spec(spec: str | EnvSpec) -> EnvSpec:
    """The EnvSpec of what env_spec returned (a registered id's, for an id)."""
    return _registry_spec(spec) if isinstance(spec, str) else spec


def _registry_spec(env: str) -> EnvSpec:
    try:
        return gym.spec(env.rpartition(":")[2])
    except gym.error.Error as exc:
        raise EnvError(f"cannot make env {env!r}: {exc}") from exc


class DropObservations(gym.ObservationWrapper, RecordConstructorArgs):
    """A Dict observation without some of its keys (--drop-observations); it records
    its arguments, so an env recreated from its spec drops them too."""

    def __init__(self, env: gym.Env, keys: list[str]) -> None:
        RecordConstructorArgs.__init__(self, keys=keys)
        gym.ObservationWrapper.__init__(self, env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Dict):
            raise EnvError(f"--drop-observations {' '.join(keys)}: the observation space "
                           f"{space} is not a Dict; only a Dict's keys can be dropped")
        unknown = [key for key in keys if key not in space.spaces]
        if unknown:
            raise EnvError(f"--drop-observations: the observation has no key "
                           f"{', '.join(map(repr, unknown))}; its keys are "
                           f"{', '.join(map(repr, space.spaces))}")
        self.keys = frozenset(keys)
        self.observation_space = gym.spaces.Dict(
            {key: sub for key, sub in space.spaces.items() if key not in self.keys})

    def observation(self, observation):
        return {key: value for key, value in observation.items() if key not in self.keys}


def _registered(env_id: str) -> bool:
    """Whether gymnasium's registry resolves `env_id` (an unversioned name: any version)."""
    if env_id in gym.envs.registry:
        return True
    try:
        namespace, name, _ = parse_env_id(env_id)
    except gym.error.Error:  # not of the form [namespace/]name[-vN]
        return False
    return find_highest_version(namespace, name) is not None


def _no_such_env(env: str, module: ModuleType, attr: str, target: object) -> EnvError:
    """The error for `--env module:attr` when attr is neither callable nor a registered id:
    the module's closest class or callable, else gymnasium's closest registered id, else
    a few of the callables the module defines."""
    what = f"--env {env}: module {module.__name__}"
    if target is not None:
        return EnvError(f"{what}: its {attr} ({type(target).__name__}) is neither an env "
                        f"class nor a function that makes one, and no env id {attr} is "
                        "registered")
    public = {name: getattr(module, name, None) for name in dir(module)
              if not name.startswith("_")}
    callables = [name for name, value in public.items() if callable(value)]
    classes = [name for name in callables if isinstance(public[name], type)]
    close = (difflib.get_close_matches(attr, classes, n=1)
             or difflib.get_close_matches(attr, callables, n=1))
    if close:
        return EnvError(f"{what} has no {attr}; did you mean {close[0]}?")
    what += f" has no {attr}, and no env id {attr} is registered"
    close = difflib.get_close_matches(attr, list(gym.envs.registry), n=1)
    if close:
        return EnvError(f"{what}; did you mean the env id {close[0]}?")
    own = [name for name in callables
           if getattr(public[name], "__module__", None) == module.__name__]
    shown = own or callables
    if not shown:
        return EnvError(f"{what}; it defines nothing callable: give --env module:Class "
                        "naming your env's class")
    more = ", ..." if len(shown) > 5 else ""
    return EnvError(f"{what}; its classes and functions include {', '.join(shown[:5])}{more}")


def check_spaces(observation_space: gym.Space, action_space: gym.Space, env: str) -> None:
    """Raise EnvError unless hetrl can train on these spaces."""
    ObsLayout.of(observation_space, env)  # raises, naming the leaf it cannot take
    if isinstance(action_space, (*_CHOICE_SPACES, gym.spaces.Box)):
        if int(np.prod(action_space.shape or ())) == 0 and not isinstance(
                action_space, gym.spaces.Discrete):
            raise EnvError(f"{env}: action space {action_space} has no dimensions to act on")
        return
    raise EnvError(f"{env}: action space {action_space} is not supported. {_nearest(action_space)}")


def _nearest(space: gym.Space) -> str:
    """What to do with an action space hetrl cannot sample from."""
    kinds = "Discrete, MultiDiscrete, MultiBinary or Box (any shape)"
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return (f"Nested actions are not supported yet: expose one {kinds} action with a "
                "gymnasium.ActionWrapper that splits it into the parts (e.g. a Box for the "
                "continuous parts, a MultiDiscrete for the choices).")
    if isinstance(space, gym.spaces.Text):
        return ("Text actions cannot be sampled by a policy head: offer a fixed set of "
                "strings as a Discrete choice with a gymnasium.ActionWrapper.")
    return f"hetrl samples {kinds}; map this one to one of them with a gymnasium.ActionWrapper."


def describe_env(settings: EnvSettings) -> EnvDescription:
    """Make one env to read and check its spaces.

    Raises:
        EnvError: the env cannot be imported or made, or its spaces are unsupported.
    """
    spec = env_spec(settings)
    try:
        env = gym.make(spec)
    except Exception as exc:
        message = f"cannot make env {settings.env!r}: {type(exc).__name__}: {exc}"
        if isinstance(spec, str) and not _registered(spec.rpartition(":")[2]):
            # gymnasium's own text above names the closest registered id, if one is close
            message += ("\nCheck the id (gymnasium.pprint_registry() lists them), or pass "
                        "--env-import for a package that registers it, or --env "
                        "pkg.mod:Class.")
        raise EnvError(message) from exc
    try:
        observation_space = env.observation_space
        check_spaces(observation_space, env.action_space, settings.env)
        return EnvDescription(observation_space, env.action_space, ale=is_ale(_as_spec(spec)))
    finally:
        env.close()


class FailureBudget:
    """An env's failure budget: a rate over its last `window` calls, not a streak.

    `call()` counts one step or reset; `fail()` counts a failed one and returns True
    once more than `rate * window` of the last `window` calls failed. An env that fails
    now and then (a fault every few hundred steps, NaN on 0.2% of steps) never exhausts
    it however long the run; one that fails on a large share of its steps, or cannot
    even be recreated, exhausts it within `window` calls.
    """

    def __init__(self, rate: float, window: int) -> None:
        self.rate, self.window = rate, window
        self.calls = 0
        self._failed_at: collections.deque[int] = collections.deque()

    def call(self) -> None:
        self.calls += 1

    def fail(self) -> bool:
        self.calls += 1
        self._failed_at.append(self.calls)
        while self._failed_at[0] <= self.calls - self.window:
            self._failed_at.popleft()
        return len(self._failed_at) > self.rate * self.window

    @property
    def recent(self) -> int:
        """Failures among the last `window` calls (as of the last failure)."""
        return len(self._failed_at)

    def describe(self) -> str:
        return (f"{self.recent} of its last {min(self.calls, self.window)} steps failed "
                f"(--env-failure-rate {self.rate} over --env-failure-window {self.window})")


def _finite(value) -> bool:
    array = np.asarray(value)
    return array.dtype.kind not in "fc" or bool(np.isfinite(array).all())


class EnvGuard(gym.Wrapper):
    """One sub-env's fault boundary: exceptions and non-finite output never escape it.

    A `step` or `reset` that raises, or (with nonfinite="drop") returns NaN/Inf, closes
    the env, makes a fresh one from the same spec and resets it; the step then returns
    the fresh first observation with reward 0, terminated = truncated = False, and
    `info[FAULT_KEY]` set, so the collector can abort the episode without bootstrapping
    it to zero. Failures are budgeted as a rate (`FailureBudget`): once more than
    `failure_rate` of its last `failure_window` calls failed it raises
    EnvUnhealthyError carrying the last traceback, and the worker exits unhealthy. An
    observation whose shape is not the space's is a bug in the env, not a fault:
    EnvShapeError names both shapes.
    """

    def __init__(self, env: gym.Env, failure_rate: float = 0.25, failure_window: int = 100,
                 nonfinite: str = "drop", on_progress: Callable[[str], None] | None = None
                 ) -> None:
        super().__init__(env)
        self._on_progress = on_progress
        if on_progress is not None:
            on_progress("made")
        self._spec = env.spec
        self.budget = FailureBudget(failure_rate, failure_window)
        self.nonfinite = nonfinite
        self._layout = ObsLayout.of(env.observation_space)

    def _check_shape(self, obs) -> None:
        try:
            wrong = self._layout.mismatch(self._layout.flatten(obs))
        except (AttributeError, TypeError):  # e.g. a number where a Dict was declared
            wrong = f"that is a {type(obs).__name__}"
        if wrong is not None:
            name = self._spec.id if self._spec else type(self.env).__name__
            raise EnvShapeError(
                f"env {name} returned an observation {wrong} (its observation_space is "
                f"{self.observation_space}). Fix the env (or its observation_space) so they "
                "agree."
            )

    def _finite(self, obs) -> bool:
        return all_finite(self._layout.flatten(obs))

    def step(self, action):
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
        except Exception:
            return self._recover(FAULT_ERROR, traceback.format_exc(), "step")
        self._check_shape(obs)
        if not (self._finite(obs) and _finite(reward)):
            return self._recover(FAULT_NONFINITE, f"non-finite output: reward {reward}, "
                                 f"observation {np.asarray(obs).tolist()}")
        self.budget.call()
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed=None, options=None):
        try:
            obs, info = self.env.reset(seed=seed, options=options)
        except Exception:
            obs, _, _, _, info = self._recover(FAULT_ERROR, traceback.format_exc(), "reset")
            return obs, info
        self._check_shape(obs)
        if not self._finite(obs):
            obs, _, _, _, info = self._recover(
                FAULT_NONFINITE, f"non-finite first observation {np.asarray(obs).tolist()}",
                "reset")
        if self._on_progress is not None:
            self._on_progress("reset")
        return obs, info

    def _recover(self, kind: int, detail: str, call: str = "step"):
        name = self._spec.id if self._spec else type(self.env).__name__
        if kind == FAULT_NONFINITE and self.nonfinite == "fail":
            raise NonFiniteError(f"env {name}: {detail} (--nonfinite fail)")
        while True:
            if self.budget.fail():
                # The first line says it all; the traceback follows for the log.
                raise EnvUnhealthyError(
                    f"env {name}: its {call} failed, and keeps failing when the env is "
                    f"recreated ({self.budget.describe()}): {_last_line(detail)}\n{detail}")
            log.warning("env failed (%s); recreating it:\n%s",
                        "exception" if kind == FAULT_ERROR else "non-finite", detail)
            try:
                self.env.close()
            except Exception:  # a broken env may not even close; it is dropped anyway
                log.debug("closing the failed env raised", exc_info=True)
            try:
                if self._spec is None:  # counted as a failure to recreate, like any other
                    raise EnvError("the env has no spec (not made by gymnasium.make); "
                                   "hetrl cannot recreate it")
                self.env = gym.make(self._spec)
                obs, info = self.env.reset()
            except Exception:
                kind, detail = FAULT_ERROR, traceback.format_exc()
                continue
            self._check_shape(obs)
            if not self._finite(obs):
                kind, detail = FAULT_NONFINITE, "non-finite first observation after recreate"
                continue
            info = dict(info)
            info[FAULT_KEY] = kind
            return obs, 0.0, False, False, info


def _last_line(detail: str) -> str:
    """The line of a traceback (or a note) that names what went wrong."""
    lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no detail)"


def make_vector_env(
    settings: EnvSettings, num_envs: int, vector_mode: str = "auto",
    on_progress: Callable[[str], None] | None = None,
) -> gym.vector.VectorEnv:
    """Make the worker's vector env with NEXT_STEP autoreset, each sub-env in an EnvGuard
    (sync and async modes; an env's own vector implementation cannot be wrapped, and
    the collector then recreates the whole vector env on a fault). `on_progress` is
    called with "made" once each sub-env exists and "reset" after each of its resets, in
    synchronous mode (async sub-envs live in other processes).

    Raises:
        EnvError: as describe_env, or the vector env does not autoreset in NEXT_STEP mode.
    """
    spec = env_spec(settings)
    guard = functools.partial(
        EnvGuard, failure_rate=getattr(settings, "env_failure_rate", 0.25),
        failure_window=getattr(settings, "env_failure_window", 100),
        nonfinite=getattr(settings, "nonfinite", "drop"),
        on_progress=on_progress if vector_mode != "async" else None,
    )
    guarded = {"vector_kwargs": {"autoreset_mode": AutoresetMode.NEXT_STEP}, "wrappers": [guard]}
    has_own = not isinstance(spec, EnvSpec) and (
        gym.spec(spec.rpartition(":")[2]).vector_entry_point is not None
    )
    if vector_mode == "auto" and has_own:
        envs = _make_vec(settings, spec, num_envs)
        plain = describe_env(settings)
        if (envs.single_observation_space == plain.observation_space
                and envs.single_action_space == plain.action_space):
            kwargs: dict = {}
        else:
            # e.g. ale-py's vector env preprocesses frames (84x84, stacked) while
            # gymnasium.make gives raw RGB: the learner describes the env with
            # gymnasium.make, so workers must simulate exactly that.
            log.info("%s: its own vector env changes the spaces; using sync instead",
                     settings.env)
            envs.close()
            kwargs = {"vectorization_mode": "sync", **guarded}
    else:
        kwargs = {"vectorization_mode": "sync" if vector_mode == "auto" else vector_mode,
                  **guarded}
    if kwargs:
        envs = _make_vec(settings, spec, num_envs, **kwargs)
    mode = envs.metadata.get("autoreset_mode")
    if mode is not None and AutoresetMode(mode) is not AutoresetMode.NEXT_STEP:
        envs.close()
        raise EnvError(f"{settings.env}: vector env autoresets in {mode}; hetrl needs NEXT_STEP")
    check_spaces(envs.single_observation_space, envs.single_action_space, settings.env)
    return envs


def _make_vec(settings: EnvSettings, spec, num_envs: int, **kwargs) -> gym.vector.VectorEnv:
    try:
        return gym.make_vec(spec, num_envs=num_envs, **kwargs)
    except Exception as exc:
        raise EnvError(f"cannot make {num_envs} x {settings.env!r}: {exc!r}") from exc
