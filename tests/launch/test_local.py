"""`hetrl local` end to end: real worker and learner processes over loopback gRPC."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from safetensors.numpy import load_file

from hetrl.launch import run_local
from hetrl.rollout.errors import ConfigError, EnvError
from hetrl.rollout.policy import Policy, load_policy_arrays
from hetrl.rollout.settings import PolicySettings
from tests.fixtures.envs import GoLeft
from tests.helpers import hetrl, processes_mentioning, wait_for


def test_cli_run_learns_and_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = hetrl("local", "--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "8",
                 "--total-steps", "60000", "--seed", "1", "--out", str(out))
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    assert processes_mentioning(str(out)) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    assert summary["global_step"] >= 60000
    assert summary["mean_return_100"] > 100, summary  # random play averages about 22
    assert summary["fragments_dropped_lag"] == 0 and summary["sequence_gaps"] == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for name in ("charts/SPS", "charts/episodic_return", "losses/approx_kl", "losses/clipfrac",
                 "losses/explained_variance", "charts/policy_lag"):
        assert any(name in r for r in records), name
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert "step" in output and "SPS" in output and "ETA" in output  # the progress line
    assert output.lstrip().startswith("hetrl local: CartPole-v1, 2 workers x 8 envs")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    assert "settings/text_summary" in events.Tags()["tensors"]  # the run's settings

    # The saved model loads into a fresh policy (safetensors, no pickle).
    env = gym.make("CartPole-v1")
    policy = Policy(env.observation_space, env.action_space, PolicySettings())
    load_policy_arrays(policy, load_file(str(out / "model.safetensors")))


@pytest.mark.slow
@pytest.mark.lowest
def test_python_api_trains_a_custom_env_class(tmp_path: Path) -> None:
    result = run_local(env=GoLeft, workers=1, envs_per_worker=4, fragment_length=20,
                       total_steps=16_000, out=str(tmp_path / "api"), progress=False)
    assert result.ok, result.summary
    assert result.model_path.exists()
    assert result.summary["mean_return_100"] > 15  # 20 is perfect, random is 10


def test_python_api_refuses_bad_input_before_spawning(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--workers"):
        run_local(workers=0, out=str(tmp_path / "a"))
    with pytest.raises(ConfigError, match="total-steps"):
        run_local(total_steps=-1, out=str(tmp_path / "b"))
    with pytest.raises(EnvError, match="cannot make env"):
        run_local(env="NoSuchEnv-v0", out=str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()

    class Local(gym.Env):
        pass

    with pytest.raises(ConfigError, match="importable module"):
        run_local(env=Local, out=str(tmp_path / "d"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "0"], "--workers must be >= 1"),
        (["--total-steps", "-5"], "--total-steps must be > 0"),
        (["--envs-per-worker", "0"], "--envs-per-worker must be >= 1"),
        (["--env", "NoSuchEnv-v0"], "cannot make env"),
        (["--env", "tests.fixtures.envs:TextInDict"], "observation leaf 'note'"),
    ],
)
def test_cli_refuses_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "bad"
    proc = hetrl("local", "--out", str(out), *args)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output
    assert message in output
    assert not (out / "launch").exists()  # nothing was spawned


def _start_long_run(out: Path, *extra: str) -> subprocess.Popen:
    proc = hetrl("local", "--total-steps", "100000000", "--out", str(out), "--workers", "2",
                 *extra, start_new_session=True)
    wait_for(lambda: (out / "metrics.jsonl").exists()
             and (out / "metrics.jsonl").read_text().count("\n") >= 2,
             timeout=120, what="training to start")
    return proc


@pytest.mark.parametrize("to_group", [pytest.param(True, id="ctrl-c-group"),
                                      pytest.param(False, id="sigint-launcher",
                                                   marks=[pytest.mark.slow,
                                                          pytest.mark.lowest])])
def test_ctrl_c_stops_every_process(tmp_path: Path, to_group: bool) -> None:
    out = tmp_path / "int"
    proc = _start_long_run(out)
    assert len(processes_mentioning(str(out))) >= 3
    if to_group:  # what a terminal does on Ctrl-C
        import os

        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    wait_for(lambda: processes_mentioning(str(out)) == [], timeout=30, what="children to exit")
    assert (out / "model.safetensors").exists()  # the learner saved what it had


def _start_logged(out: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    """A long `hetrl local` run whose output (both streams) goes to a file we can poll."""
    import os
    import sys

    from tests.helpers import ROOT

    log = out.parent / f"{out.name}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetrl.launch", "local", "--total-steps", "100000000",
         "--out", str(out), "--workers", "2", "--no-progress", *extra],
        cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=log.open("w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(lambda: (out / "metrics.jsonl").exists()
             and (out / "metrics.jsonl").read_text().count("\n") >= 2,
             timeout=120, what="training to start")
    return proc, log


@pytest.mark.slow
@pytest.mark.lowest
def test_ctrl_c_says_what_it_does_names_itself_and_how_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "int"
    proc, log = _start_logged(out)
    import os

    os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C
    assert proc.wait(60) == 130
    output = log.read_text()
    assert "hetrl: Ctrl-C: stopping; the learner saves its model and a checkpoint" in output
    assert "Traceback" not in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "stopped: Ctrl-C (SIGINT)"
    assert summary["workers_lost"] == []  # the workers were stopped by the learner, in order
    assert output.rstrip().splitlines()[-1] == (
        f"hetrl: to continue this run: hetrl local --out {out} --resume")
    wait_for(lambda: processes_mentioning(str(out)) == [], timeout=30, what="children to exit")


def test_a_second_ctrl_c_stops_at_once_without_a_traceback(tmp_path: Path) -> None:
    out = tmp_path / "int2"
    # The learner takes its time to stop: a frozen learner never would.
    proc, log = _start_logged(out, "--shutdown-grace", "60")
    import os

    learner = processes_mentioning(str(out / "launch" / "learner.json"))[0]
    os.kill(learner, signal.SIGSTOP)
    os.killpg(proc.pid, signal.SIGINT)
    wait_for(lambda: "Ctrl-C: stopping" in log.read_text(), 30, "the first Ctrl-C's line")
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(30) == 130
    assert time.monotonic() - sent < 10
    output = log.read_text()
    assert "Ctrl-C again: stopped at once" in output and "Traceback" not in output, output
    wait_for(lambda: processes_mentioning(str(out)) == [], timeout=30, what="children to exit")


def test_a_batch_bigger_than_the_budget_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    proc = hetrl("local", "--envs-per-worker", "1000", "--total-steps", "100000",
                 "--out", str(tmp_path / "big"))
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, output
    assert "one training batch holds 128,000 env steps" in output
    assert "lower --envs-per-worker or --fragment-length" in output
    assert not (tmp_path / "big").exists()


def test_a_run_says_where_its_time_went(tmp_path: Path) -> None:
    result = run_local(env="CartPole-v1", workers=1, envs_per_worker=4, fragment_length=32,
                       total_steps=4096, out=str(tmp_path / "t"), progress=False, report=False)
    assert result.ok
    timing = result.summary["timing"]
    parts = [timing[k] for k in ("startup_seconds", "training_seconds", "stop_seconds")]
    assert all(p is not None and p >= 0 for p in parts), timing
    assert sum(parts) == pytest.approx(timing["command_seconds"], abs=0.5)
    assert not (result.out / "report").exists()  # --no-report
    first = result.outcome_lines()[0]
    assert first.startswith("finished in ") and "start-up" in first and "training" in first


@pytest.mark.slow
@pytest.mark.lowest
def test_crashing_worker_stops_everything(measured, tmp_path: Path) -> None:
    out = tmp_path / "crash"
    proc = hetrl("local", "--env", "tests.fixtures.envs:CrashAfter", "--total-steps", "10000000",
                 "--out", str(out), env={"HETRL_TEST_CRASH_AFTER": "300"})
    output, _ = proc.communicate(timeout=120)
    exited = time.monotonic()
    assert proc.returncode == 1, output
    assert "simulator exploded" in output  # the worker's traceback reaches the user
    wait_for(lambda: processes_mentioning(str(out)) == [], timeout=30, what="children to exit")
    measured("an env failing every step after 300: the run ended (exit 1) with the env's "
             f"traceback; no process of the run left {time.monotonic() - exited:.1f} s after "
             "the launcher exited")


@pytest.mark.slow
@pytest.mark.lowest
def test_killed_learner_stops_everything(tmp_path: Path) -> None:
    out = tmp_path / "kill"
    proc = _start_long_run(out)
    learner = [p for p in processes_mentioning(str(out / "launch" / "learner.json"))]
    assert len(learner) == 1
    import os

    os.kill(learner[0], signal.SIGKILL)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, output
    assert "the learner was killed by SIGKILL" in output
    wait_for(lambda: processes_mentioning(str(out)) == [], timeout=30, what="children to exit")


@pytest.mark.slow
@pytest.mark.lowest
def test_model_output_is_usable(tmp_path: Path) -> None:
    result = run_local(env="Pendulum-v1", workers=1, envs_per_worker=2, fragment_length=16,
                       total_steps=2_000, out=str(tmp_path / "pend"), progress=False)
    assert result.ok
    arrays = load_file(str(result.model_path))
    assert "log_std" in arrays and np.all(np.isfinite(arrays["log_std"]))


def test_normalised_rewards_leave_reported_returns_raw(tmp_path: Path) -> None:
    # Pendulum loses up to 16 per step, ~1,000-1,600 per 200-step episode at first;
    # rewards normalised for training are ~0.1 per step, so a reported return near
    # -20 would mean the normalised rewards leaked into the metrics.
    result = run_local(env="Pendulum-v1", workers=1, envs_per_worker=2, fragment_length=50,
                       total_steps=2_000, normalize_rewards=True, out=str(tmp_path / "p"),
                       progress=False)
    assert result.ok
    assert result.summary["mean_return_100"] < -300


@pytest.mark.slow
@pytest.mark.lowest
def test_children_die_with_a_sigkilled_launcher(tmp_path: Path) -> None:
    # No cleanup code runs in a SIGKILLed launcher: the kernel's parent-death signal,
    # which every child asks for at start (rollout.lifetime), must end them.
    out = tmp_path / "orphans"
    proc = _start_long_run(out)
    children = processes_mentioning(str(out))
    assert len(children) >= 3
    proc.kill()
    proc.wait(10)
    wait_for(lambda: processes_mentioning(str(out)) == [], timeout=60,
             what="every child of the killed launcher to exit")


def test_no_worker_is_restarted_once_the_learner_is_finishing(tmp_path: Path) -> None:
    """The end-of-run race: a worker that dies as the learner finishes is not restarted,
    a worker that never heard the learner's Stop is stopped, and the run exits 0."""
    import os
    import sys
    import time

    from hetrl.launch.local import _watch
    from hetrl.launch.processes import spawn_command
    from hetrl.launch.supervisor import Supervisor
    from hetrl.rollout.settings import WorkerSettings

    finishing = tmp_path / "learner.finishing"

    def python(name: str, code: str):
        return spawn_command(name, [sys.executable, "-c", code], dict(os.environ), None)

    # Worker 0 exits with the watchdog's code (5) once the learner is finishing, as a hung
    # env would; worker 1 never hears a Stop.
    workers_code = [f"import os, time\nwhile not os.path.exists({str(finishing)!r}):"
                    " time.sleep(0.01)\nraise SystemExit(5)",
                    "import time; time.sleep(600)"]
    spawned: list[int] = []

    class StandIns(Supervisor):
        def spawn(self, index: int, port: int, ready_file: str):
            spawned.append(index)
            return python(f"worker-{index}", workers_code[index])

    workers = StandIns(lambda *_: WorkerSettings(), tmp_path, dict(os.environ))
    workers.start([0, 0])
    dying, deaf = workers.workers
    learner = python("learner", f"import pathlib, time; pathlib.Path({str(finishing)!r}).touch()"
                                "; time.sleep(1.0)")
    started = time.monotonic()
    code = _watch(workers, [learner], finishing, grace=5.0)
    assert code == 0
    assert spawned == [0, 1]  # nothing restarted
    assert dying.exit_code() == 5 and deaf.exit_code() is not None
    assert time.monotonic() - started < 30


def test_cli_imports_user_modules_from_cwd_and_user_folders_cannot_shadow_hetrl(
    tmp_path: Path,
) -> None:
    """Run from a project with its own rollout/ and launch/ folders and an env module
    next to them, through the installed `hetrl` script, with no PYTHONPATH."""
    import os
    import sys

    project = tmp_path / "project"
    for shadow in ("hetrl", "rollout", "launch", "learner", "protos"):
        (project / shadow).mkdir(parents=True)
        (project / shadow / "__init__.py").write_text("raise ImportError('the user s file')\n")
    (project / "rollout" / "worker.py").write_text("raise SystemExit(0)\n")
    (project / "my_pkg").mkdir()
    (project / "my_pkg" / "__init__.py").write_text("")
    (project / "my_pkg" / "envs.py").write_text(
        "import gymnasium as gym\n"
        "from gymnasium.envs.classic_control.cartpole import CartPoleEnv\n\n\n"
        "class Corridor(CartPoleEnv):\n    pass\n")
    script = Path(sys.executable).parent / "hetrl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(script), "local", "--env", "my_pkg.envs:Corridor", "--workers", "1",
         "--envs-per-worker", "2", "--fragment-length", "16", "--total-steps", "640",
         "--no-progress", "--out", str(tmp_path / "run")],
        cwd=project, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["env"] == "my_pkg.envs:Corridor" and summary["global_step"] >= 640

    missing = subprocess.run(
        [str(script), "local", "--env", "not_here.envs:Corridor", "--out",
         str(tmp_path / "run2")], cwd=project, env=env, capture_output=True, text=True,
        timeout=120)
    assert missing.returncode == 2
    assert "current directory" in missing.stderr and str(project) in missing.stderr


def test_hetrl_is_one_importable_namespace() -> None:
    import hetrl
    from hetrl import RunResult, run_local
    from hetrl.launch import run_local as launch_run_local

    assert run_local is launch_run_local and RunResult.__name__ == "RunResult"
    assert {"protos", "rollout", "learner", "launch"} <= {
        p.name for p in Path(hetrl.__file__).parent.iterdir() if (p / "__init__.py").exists()}


def test_a_group_failure_blames_the_rank_killed_by_a_signal() -> None:
    """When one rank is killed, the others exit with an error because of it: the launcher
    names the killed one, whichever rank it is."""
    from hetrl.launch.local import _first_cause

    ranks = ["learner-rank0", "learner-rank1", "learner-rank2"]
    assert _first_cause(ranks, [1, -9, None]) == ("learner-rank1", -9)  # type: ignore[arg-type]
    assert _first_cause(ranks, [None, 3, 1]) == ("learner-rank1", 3)  # type: ignore[arg-type]
    assert _first_cause(ranks, [0, None, None]) is None  # type: ignore[arg-type]
