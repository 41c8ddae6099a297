"""Central inference on the learner: one batched forward pass for every worker's envs.

`InferenceServer` owns the thread "inference" and its own copy of the policy on the
learner's device. Stream threads submit the observations of one env group at a time;
the thread takes everything pending, runs one forward pass, samples, and answers each
submitter with its actions (as sampled, for training, and as the env takes them) and
the version that chose them. Requests that arrive while a pass runs make the next
batch bigger, so the batch grows with the number of workers without a waiting timer.
Its copy of the policy is replaced by the weights-publisher after every finite update
(`load`); the training thread never waits on it, and it never waits on an update,
since it holds weights of its own.

The fragments are built from its answers by learner/central.py.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import gymnasium as gym
import numpy as np
import torch

from hetrl.learner.central import Reply
from hetrl.rollout.errors import HetrlError
from hetrl.rollout.observations import Obs, batch_size, concatenate, tree_map
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import PolicySettings

log = logging.getLogger("hetrl.learner")

@dataclasses.dataclass
class _Request:
    observations: Obs
    reply: Reply
    memory: tuple[np.ndarray, np.ndarray] | None = None


class InferenceServer:
    """The inference thread and the policy copy it samples from."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 settings: PolicySettings, device: torch.device,
                 state: dict[str, torch.Tensor], version: int) -> None:
        self.device = device
        self.policy = Policy(observation_space, action_space, settings).to(device)
        self.policy.eval()
        self.policy.load_state_dict(state)
        self.version = version
        self._weights_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._closed = False
        self.failure: BaseException | None = None
        # Books: forward passes, rows (env observations) answered, and time in passes.
        self.passes = 0
        self.rows = 0
        self.busy_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="inference", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def load(self, version: int, state: dict[str, torch.Tensor],
             event: torch.cuda.Event | None = None) -> None:
        """Sample with `state` (a snapshot nobody modifies) from the next pass on."""
        with self._weights_lock:
            if event is not None:
                torch.cuda.current_stream(self.device).wait_event(event)
            self.policy.load_state_dict(state)
            self.version = version

    def submit(self, observations: Obs, reply: Reply,
               memory: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Choose actions for `observations` [n, *obs] (per leaf, nested), from the
        envs' hidden states for a recurrent policy (`memory`: [n, S] states and [n]
        episode starts); `reply` is called from the inference thread (never under a
        lock of the caller's)."""
        with self._cond:
            if self._closed:
                return
            self._pending.append(_Request(observations, reply, memory))
            self._cond.notify()

    def stats(self) -> dict[str, float]:
        """Forward passes, mean rows per pass and busy seconds, for the run summary."""
        return {"inference_passes": self.passes,
                "inference_rows_per_pass": self.rows / self.passes if self.passes else 0.0,
                "inference_seconds": round(self.busy_seconds, 3)}

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._closed or bool(self._pending))
                    if self._closed:
                        return
                    batch, self._pending = self._pending, []
                self._answer(batch)
        except Exception as exc:  # a bug or a broken policy: the streams stall, so say it
            self.failure = exc
            log.exception("central inference failed")

    @torch.no_grad()
    def _answer(self, batch: list[_Request]) -> None:
        start = time.perf_counter()
        # One copy: the batch, writable (observations decoded off the wire are not).
        obs = concatenate([r.observations for r in batch])
        on_device = tree_map(lambda a: torch.from_numpy(a).to(self.device), obs)
        states = None
        with self._weights_lock:
            if self.policy.state_size:  # one step of every env's sequence
                memories = [r.memory for r in batch if r.memory is not None]
                assert len(memories) == len(batch), "a recurrent policy needs the states"
                state = torch.from_numpy(np.concatenate([m[0] for m in memories]))
                starts = torch.from_numpy(np.concatenate([m[1] for m in memories]))
                dist, _, new_state = self.policy.sequence(
                    on_device, starts[None].to(self.device), state.to(self.device))
                states = new_state.cpu().numpy()
            else:
                dist, _ = self.policy(on_device)
            sampled = dist.sample()
            logprobs = dist.log_prob(sampled).cpu().numpy()
            version = self.version
        actions = sampled.cpu().numpy()
        env_actions = self.policy.env_actions(actions)
        self.passes += 1
        self.rows += batch_size(obs)
        self.busy_seconds += time.perf_counter() - start
        row = 0
        for request in batch:
            n = batch_size(request.observations)
            request.reply(actions[row:row + n], logprobs[row:row + n],
                          env_actions[row:row + n], version,
                          None if states is None else states[row:row + n])
            row += n


def check_inference_alive(inference: InferenceServer | None) -> None:
    """Raise if the inference thread died (the streams would wait forever)."""
    if inference is not None and inference.failure is not None:
        raise HetrlError(f"central inference failed: {inference.failure!r}")
