"""Which placement of the policy wins for an env and policy: worker or central inference.

It measures, on one core of this machine, what one env step costs each way:
- worker inference: the env itself, plus the worker's CPU forward pass (its batch of
  --envs-per-worker observations) per env step;
- central inference: the env itself, plus what the env host spends per step on the
  wire (encoding a group's EnvStep, decoding its Actions), and, on the learner, one
  batched forward pass for every worker's group (2 workers' worth here) and the
  fragment bookkeeping, per env step. A group also waits one round trip per step
  unless the other group's stepping hides it: with G envs per group stepping in
  `env_us * G`, the env host runs at most G envs per round trip.
The choice is the placement with the fewer core-microseconds per env step, after that
round-trip bound; on a GPU learner, the central forward pass runs on the GPU and costs
the learner host's cores less than measured here, so this leans towards worker
inference. It starts no process and opens no socket beyond one loopback round trip.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np


@dataclasses.dataclass(frozen=True)
class PlacementCosts:
    """Measured per env step, in microseconds of one core."""

    env_us: float
    worker_policy_us: float
    central_wire_us: float
    central_learner_us: float
    round_trip_us: float
    group_size: int

    def worker_core_us(self) -> float:
        return self.env_us + self.worker_policy_us

    def central_core_us(self) -> float:
        return self.env_us + self.central_wire_us + self.central_learner_us

    def central_env_host_rate(self) -> float:
        """Env steps/s one env-host core gives in central mode (round trip included)."""
        busy = 1e6 / (self.env_us + self.central_wire_us)
        # Two groups take turns: a group's round trip is hidden while the other steps.
        latency_bound = 2 * self.group_size * 1e6 / max(
            self.round_trip_us, self.group_size * (self.env_us + self.central_wire_us))
        return min(busy, latency_bound)

    def central_effective_us(self) -> float:
        """Core-us per env step in central mode, an env-host core that waits for its
        round trip counted as spent."""
        return 1e6 / self.central_env_host_rate() + self.central_learner_us

    def choice(self) -> str:
        """worker or central: the fewer core-us per env step."""
        return "central" if self.central_effective_us() < self.worker_core_us() else "worker"

    def lines(self) -> list[str]:
        """What `hetrl plan` prints about the placement."""
        return [
            f"placement, per env step on one core: env {self.env_us:,.0f} us; worker "
            f"inference adds {self.worker_policy_us:,.0f} us of CPU policy = "
            f"{self.worker_core_us():,.0f} us; central inference adds "
            f"{self.central_wire_us:,.0f} us on the env host and "
            f"{self.central_learner_us:,.0f} us on the learner (batched pass and "
            f"assembly), with a {self.round_trip_us:,.0f} us round trip per group of "
            f"{self.group_size} = {self.central_effective_us():,.0f} us",
            f"placement: --inference {self.choice()} wins for this env and policy "
            f"({1e6 / self.worker_core_us():,.0f} vs {1e6 / self.central_effective_us():,.0f} "
            "env steps/s per core, worker vs central)",
        ]


def _time(call, seconds: float, per: int) -> float:
    """Microseconds per unit of `call()` (each call does `per` units)."""
    call()  # warm-up
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or calls < 3:
        call()
        calls += 1
    return (time.perf_counter() - start) / (calls * per) * 1e6


def measure_placement(settings, seconds: float = 1.0, workers: int = 2) -> PlacementCosts:
    """Per-step costs of both placements for `settings` (env, policy, envs per worker)."""
    import torch

    from hetrl.learner.central import CentralAssembler, CentralShapes
    from hetrl.protos import hetrl_pb2
    from hetrl.rollout import wire
    from hetrl.rollout.env_server import env_step_message, group_sizes
    from hetrl.rollout.envs import action_dtype, action_shape, make_vector_env
    from hetrl.rollout.observations import tree_map
    from hetrl.rollout.policy import Policy
    from hetrl.rollout.stepping import EnvStepper

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    n = settings.envs_per_worker
    group = group_sizes(n)[0]
    envs = make_vector_env(settings, group, settings.vector_mode)
    try:
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        stepper = EnvStepper(envs)
        stepper.reset(seed=settings.seed)
        policy = Policy(obs_space, act_space, settings)
        policy.eval()
        sample = policy.obs_layout.sample(obs_space, n * workers)
        first_group = tree_map(lambda o: o[:group], sample)
        first_worker = tree_map(lambda o: o[:n], sample)
        actions, _ = policy.act(first_group)
        env_actions = policy.env_actions(actions)
        env_us = _time(lambda: stepper.step(env_actions), seconds, group)
        worker_policy_us = _time(lambda: policy.act(first_worker), seconds, n)
        central_pass_us = _time(lambda: policy.act(sample), seconds, n * workers)
        result = stepper.step(env_actions)
        message = env_step_message(0, 1, *result)
        reply = hetrl_pb2.LearnerMessage(actions=hetrl_pb2.Actions(
            group=0, step=1, actions=wire.encode(np.ascontiguousarray(env_actions))))
        encoded = reply.SerializeToString()

        def env_side() -> None:  # what an env host adds per group step
            env_step_message(0, 1, *result)
            wire.decode(hetrl_pb2.LearnerMessage.FromString(encoded).actions.actions)

        central_wire_us = _time(env_side, seconds, group)
        hello = hetrl_pb2.Hello(num_envs=n, fragment_length=settings.fragment_length,
                                env_groups=len(group_sizes(n)))  # group 0 is timed
        shapes = CentralShapes(policy.obs_layout, action_shape(act_space),
                               action_dtype(act_space))

        class Immediate:
            def submit(self, observations, answer, memory=None):
                answer(actions, np.zeros(group, np.float32), env_actions, 0)

        assembler = CentralAssembler(hello, shapes, 1 << 30, Immediate(), send=lambda _: None)
        step = hetrl_pb2.WorkerMessage.FromString(message).env_step
        counter = iter(range(1 << 62))

        def learner_side() -> None:  # decode, bookkeeping, encode the actions
            step.step = next(counter)
            assembler.on_env_step(step)
            assembler.groups[0].done.clear()  # group 1 never joins them: let them go

        assembly_us = _time(learner_side, seconds, group)
        round_trip_us = loopback_round_trip_us(settings)
        return PlacementCosts(env_us, worker_policy_us, central_wire_us,
                              central_pass_us + assembly_us, round_trip_us, group)
    finally:
        envs.close()
        torch.set_num_threads(threads)


def loopback_round_trip_us(settings, steps: int = 200, host: str = "127.0.0.1") -> float:
    """One EnvStep -> Actions round trip on loopback gRPC to a real env server of one
    env (the env's own step included, which is tiny next to the wire for most envs)."""
    import queue

    from hetrl.protos import hetrl_pb2, hetrl_pb2_grpc
    from hetrl.rollout import wire
    from hetrl.rollout.env_server import EnvServer
    from hetrl.rollout.serving import add_to_server
    from hetrl.rollout.settings import WorkerSettings, pick
    from hetrl.rollout.transport import auth_metadata, create_channel, create_server, new_token

    token = new_token()
    server = EnvServer(pick(WorkerSettings, settings, envs_per_worker=1, inference="central"))
    grpc_server, port = create_server(f"{host}:0", token)
    add_to_server(server, grpc_server)
    grpc_server.start()
    requests: queue.Queue = queue.Queue()
    try:
        stub = hetrl_pb2_grpc.RolloutStub(create_channel(f"{host}:{port}"))
        responses = stub.Stream(iter(requests.get, None), metadata=auth_metadata(token),
                                timeout=60)
        next(responses)
        first = next(responses).env_step
        action = server.groups[0].envs.single_action_space.sample()
        actions = wire.encode(np.asarray([action], dtype=server.action_dtype))
        step, start = first.step, 0.0
        for i in range(steps + 10):
            if i == 10:
                start = time.perf_counter()
            requests.put(hetrl_pb2.LearnerMessage(actions=hetrl_pb2.Actions(
                group=0, step=step, actions=actions)))
            step = next(responses).env_step.step
        return (time.perf_counter() - start) / steps * 1e6
    finally:
        requests.put(None)
        server.request_stop("measured")
        grpc_server.stop(0).wait(5)
        server.close()
