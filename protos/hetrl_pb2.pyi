from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NDArray(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class NamedArray(_message.Message):
    __slots__ = ("name", "array")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    name: str
    array: NDArray
    def __init__(self, name: _Optional[str] = ..., array: _Optional[_Union[NDArray, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("worker_id", "incarnation", "num_envs", "fragment_length", "env", "observation_space", "action_space", "inference", "env_groups", "normalize_rewards", "reward_norm_gamma", "reward_clip", "clip_rewards")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_FIELD_NUMBER: _ClassVar[int]
    ENV_GROUPS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_REWARDS_FIELD_NUMBER: _ClassVar[int]
    REWARD_NORM_GAMMA_FIELD_NUMBER: _ClassVar[int]
    REWARD_CLIP_FIELD_NUMBER: _ClassVar[int]
    CLIP_REWARDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    incarnation: str
    num_envs: int
    fragment_length: int
    env: str
    observation_space: str
    action_space: str
    inference: str
    env_groups: int
    normalize_rewards: bool
    reward_norm_gamma: float
    reward_clip: float
    clip_rewards: bool
    def __init__(self, worker_id: _Optional[int] = ..., incarnation: _Optional[str] = ..., num_envs: _Optional[int] = ..., fragment_length: _Optional[int] = ..., env: _Optional[str] = ..., observation_space: _Optional[str] = ..., action_space: _Optional[str] = ..., inference: _Optional[str] = ..., env_groups: _Optional[int] = ..., normalize_rewards: _Optional[bool] = ..., reward_norm_gamma: _Optional[float] = ..., reward_clip: _Optional[float] = ..., clip_rewards: _Optional[bool] = ...) -> None: ...

class Fragment(_message.Message):
    __slots__ = ("worker_id", "incarnation", "sequence", "policy_version", "observations", "actions", "rewards", "terminated", "truncated", "logprobs", "valid", "episode_returns", "episode_lengths", "collect_seconds", "wait_seconds", "env_faults", "episodes_aborted", "observation_leaves", "starts", "initial_state", "observation_stacks")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURNS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    COLLECT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENV_FAULTS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_ABORTED_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_LEAVES_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_STATE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_STACKS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    incarnation: str
    sequence: int
    policy_version: int
    observations: NDArray
    actions: NDArray
    rewards: NDArray
    terminated: NDArray
    truncated: NDArray
    logprobs: NDArray
    valid: NDArray
    episode_returns: NDArray
    episode_lengths: NDArray
    collect_seconds: float
    wait_seconds: float
    env_faults: int
    episodes_aborted: int
    observation_leaves: _containers.RepeatedCompositeFieldContainer[NamedArray]
    starts: NDArray
    initial_state: NDArray
    observation_stacks: FrameStacks
    def __init__(self, worker_id: _Optional[int] = ..., incarnation: _Optional[str] = ..., sequence: _Optional[int] = ..., policy_version: _Optional[int] = ..., observations: _Optional[_Union[NDArray, _Mapping]] = ..., actions: _Optional[_Union[NDArray, _Mapping]] = ..., rewards: _Optional[_Union[NDArray, _Mapping]] = ..., terminated: _Optional[_Union[NDArray, _Mapping]] = ..., truncated: _Optional[_Union[NDArray, _Mapping]] = ..., logprobs: _Optional[_Union[NDArray, _Mapping]] = ..., valid: _Optional[_Union[NDArray, _Mapping]] = ..., episode_returns: _Optional[_Union[NDArray, _Mapping]] = ..., episode_lengths: _Optional[_Union[NDArray, _Mapping]] = ..., collect_seconds: _Optional[float] = ..., wait_seconds: _Optional[float] = ..., env_faults: _Optional[int] = ..., episodes_aborted: _Optional[int] = ..., observation_leaves: _Optional[_Iterable[_Union[NamedArray, _Mapping]]] = ..., starts: _Optional[_Union[NDArray, _Mapping]] = ..., initial_state: _Optional[_Union[NDArray, _Mapping]] = ..., observation_stacks: _Optional[_Union[FrameStacks, _Mapping]] = ...) -> None: ...

class FrameStacks(_message.Message):
    __slots__ = ("frames", "whole")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    WHOLE_FIELD_NUMBER: _ClassVar[int]
    frames: NDArray
    whole: NDArray
    def __init__(self, frames: _Optional[_Union[NDArray, _Mapping]] = ..., whole: _Optional[_Union[NDArray, _Mapping]] = ...) -> None: ...

class EnvStep(_message.Message):
    __slots__ = ("group", "step", "observations", "rewards", "terminated", "truncated", "faulted", "step_seconds", "observation_leaves", "life_lost", "observation_stacks")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FAULTED_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_LEAVES_FIELD_NUMBER: _ClassVar[int]
    LIFE_LOST_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_STACKS_FIELD_NUMBER: _ClassVar[int]
    group: int
    step: int
    observations: NDArray
    rewards: NDArray
    terminated: NDArray
    truncated: NDArray
    faulted: NDArray
    step_seconds: float
    observation_leaves: _containers.RepeatedCompositeFieldContainer[NamedArray]
    life_lost: NDArray
    observation_stacks: FrameStacks
    def __init__(self, group: _Optional[int] = ..., step: _Optional[int] = ..., observations: _Optional[_Union[NDArray, _Mapping]] = ..., rewards: _Optional[_Union[NDArray, _Mapping]] = ..., terminated: _Optional[_Union[NDArray, _Mapping]] = ..., truncated: _Optional[_Union[NDArray, _Mapping]] = ..., faulted: _Optional[_Union[NDArray, _Mapping]] = ..., step_seconds: _Optional[float] = ..., observation_leaves: _Optional[_Iterable[_Union[NamedArray, _Mapping]]] = ..., life_lost: _Optional[_Union[NDArray, _Mapping]] = ..., observation_stacks: _Optional[_Union[FrameStacks, _Mapping]] = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "fragment", "env_step")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    ENV_STEP_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    fragment: Fragment
    env_step: EnvStep
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., fragment: _Optional[_Union[Fragment, _Mapping]] = ..., env_step: _Optional[_Union[EnvStep, _Mapping]] = ...) -> None: ...

class Weights(_message.Message):
    __slots__ = ("version", "arrays")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARRAYS_FIELD_NUMBER: _ClassVar[int]
    version: int
    arrays: _containers.RepeatedCompositeFieldContainer[NamedArray]
    def __init__(self, version: _Optional[int] = ..., arrays: _Optional[_Iterable[_Union[NamedArray, _Mapping]]] = ...) -> None: ...

class Credits(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class Stop(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Actions(_message.Message):
    __slots__ = ("group", "step", "actions")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    group: int
    step: int
    actions: NDArray
    def __init__(self, group: _Optional[int] = ..., step: _Optional[int] = ..., actions: _Optional[_Union[NDArray, _Mapping]] = ...) -> None: ...

class LearnerMessage(_message.Message):
    __slots__ = ("weights", "credits", "stop", "actions")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    weights: Weights
    credits: Credits
    stop: Stop
    actions: Actions
    def __init__(self, weights: _Optional[_Union[Weights, _Mapping]] = ..., credits: _Optional[_Union[Credits, _Mapping]] = ..., stop: _Optional[_Union[Stop, _Mapping]] = ..., actions: _Optional[_Union[Actions, _Mapping]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HostInfo(_message.Message):
    __slots__ = ("host", "worker_addresses", "cores")
    HOST_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    host: str
    worker_addresses: _containers.RepeatedScalarFieldContainer[str]
    cores: int
    def __init__(self, host: _Optional[str] = ..., worker_addresses: _Optional[_Iterable[str]] = ..., cores: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("learner",)
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    learner: str
    def __init__(self, learner: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("cpu_percent", "memory_percent", "workers_running")
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    WORKERS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    cpu_percent: float
    memory_percent: float
    workers_running: int
    def __init__(self, cpu_percent: _Optional[float] = ..., memory_percent: _Optional[float] = ..., workers_running: _Optional[int] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class StopReply(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...
