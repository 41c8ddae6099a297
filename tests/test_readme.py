"""The code in README.md and docs/ runs as written.

The own-environment example's two blocks become my_pkg/envs.py and train.py in an empty
folder, and train.py trains (with a smaller step budget) and prints what the page says it
prints. The README's tour runs command by command in an empty folder, with smaller step
budgets: local, enjoy, the Python block, emulate and submit's dry run. So do the blocks
of the docs pages (running workers by hand, reports, the SageMaker dry run, playing a
trained policy), and a last test checks that no bash or python block is left unrun.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, free_port


def _blocks(page: str, language: str, heading: str | None = None) -> list[str]:
    """The `language` code blocks of a page (of one of its sections, by heading)."""
    text = (ROOT / page).read_text()
    if heading is not None:
        text = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


@pytest.mark.slow
def test_the_own_environment_example_runs_as_written(tmp_path: Path) -> None:
    blocks = _blocks("docs/own-env.md", "python")
    env_code = next(b for b in blocks if b.startswith("# my_pkg/envs.py"))
    train_code = next(b for b in blocks if b.startswith("# train.py"))
    assert "total_steps=100_000" in train_code
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "envs.py").write_text(env_code)
    (tmp_path / "train.py").write_text(train_code.replace("total_steps=100_000",
                                                          "total_steps=20_000"))
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ok_line, action_line = proc.stdout.strip().splitlines()[-2:]
    assert ok_line.startswith("True ") and "runs/maze/model.safetensors" in ok_line
    assert action_line == "1", proc.stdout  # it learned to walk right


def _shell_commands(block: str) -> list[str]:
    """A bash block's commands, continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]


def _run(command: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """A documented shell command as a user types it, `hetrl` being this checkout's."""
    command = re.sub(r"(?m)(^|&& |; )hetrl ", rf"\g<1>{sys.executable} -m hetrl ", command)
    proc = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _small_budget(command: str) -> str:
    """A documented command with a 4,000-step budget instead of the page's."""
    return re.sub(r"--total-steps \d+", "--total-steps 4000", command)


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    tour = "## A tour in five commands"
    commands = [c for b in _blocks("README.md", "bash", tour) for c in _shell_commands(b)]
    assert [c.split()[1] for c in commands] == ["local", "enjoy", "emulate", "submit"]
    python_block, = _blocks("README.md", "python", tour)
    (tmp_path / "tour.py").write_text(python_block.replace("total_steps=50_000",
                                                           "total_steps=4_000"))
    steps = [(c, _small_budget(c)) for c in commands]
    steps.insert(2, ("the Python block", f"{sys.executable} tour.py"))
    for shown, command in steps:
        proc = _run(command, tmp_path)
        if shown == "the Python block":
            ok_line, action_line = proc.stdout.strip().splitlines()[-2:]
            assert ok_line.startswith("True ") and action_line in {"0", "1"}, proc.stdout
        if " submit " in command:
            assert '"InstanceGroups"' in proc.stdout


def _train_cartpole(folder: Path) -> None:
    """runs/cartpole as the README's tour makes it, with a 4,000-step budget."""
    tour = next(c for c in _shell_commands(_blocks("README.md", "bash",
                                                   "## A tour in five commands")[0]))
    assert tour.startswith("hetrl local") and "--out runs/cartpole" in tour
    _run(_small_budget(tour), folder)


@pytest.mark.slow
def test_getting_starteds_commands_and_python_run_as_written(tmp_path: Path) -> None:
    pytest.importorskip("moviepy")  # --video, the `video` extra
    page = "docs/getting-started.md"
    setup, make_train, enjoy = _blocks(page, "bash")
    assert [c.split()[:2] for c in _shell_commands(setup)] == [["make", "train"],
                                                                ["make", "test"]]
    train_recipe = (ROOT / "Makefile").read_text().split("\ntrain:", 1)[1].split("\n\n")[0]
    documented, = _shell_commands(make_train)
    assert documented.split() == " ".join(
        line.strip().rstrip("\\") for line in train_recipe.splitlines()[1:]).replace(
        "$(VENV)/bin/hetrl", "hetrl").split(), "make train's command differs from the page"
    _train_cartpole(tmp_path)
    command, = _shell_commands(enjoy)
    out = _run(command, tmp_path).stdout
    assert "return" in out and list((tmp_path / "videos").glob("*.mp4")), out
    python_block, = _blocks(page, "python")
    (tmp_path / "play.py").write_text(python_block)
    assert "return" in _run(f"{sys.executable} play.py", tmp_path).stdout


@pytest.mark.slow
def test_running_workers_and_the_learner_by_hand_works_as_written(tmp_path: Path) -> None:
    """docs/cli.md's two machines, on this one: its address made 127.0.0.1, a free port,
    and a step budget for the learner; the worker ends when the learner is done."""
    pytest.importorskip("mujoco")  # the block's Humanoid-v5
    block, = _blocks("docs/cli.md", "bash")
    port = str(free_port())
    export, worker, learner = (
        c.replace("10.0.0.5", "127.0.0.1").replace("7000", port) for c in _shell_commands(block))
    assert export.startswith("export HETRL_TOKEN=") and worker.startswith("hetrl worker")
    script = (f"{export}\n{worker} &\n{learner} --total-steps 2048 --out run\n"
              "code=$?; wait $!; exit $code")
    _run(script.replace("python -c", f"{sys.executable} -c"), tmp_path, timeout=240)
    assert (tmp_path / "run" / "model.safetensors").exists()


@pytest.mark.slow
def test_the_cost_pages_reports_and_plan_run_as_written(tmp_path: Path) -> None:
    page = "docs/cost.md"
    commands = _shell_commands(_blocks(page, "bash")[0])
    assert [c.split()[1] for c in commands] == ["local", "local", "report", "report", "report"]
    for command in commands:
        out = _run(_small_budget(command), tmp_path).stdout
        if command.endswith("ml.c5.9xlarge"):
            assert "$" in out, out  # the comparison prices both runs
    plan_line = next(line for line in (ROOT / page).read_text().splitlines()
                     if line.startswith("$ hetrl plan"))
    out = _run(plan_line.removeprefix("$ "), tmp_path).stdout
    assert out.startswith("env Humanoid-v5: ") and "learner ml.g5.2xlarge: 50,000" in out, out


@pytest.mark.slow
def test_the_cluster_pages_emulation_and_dry_run_run_as_written(tmp_path: Path) -> None:
    pytest.importorskip("sagemaker")
    page = "docs/cluster.md"
    emulate, = _shell_commands(_blocks(page, "bash")[0])
    assert emulate.startswith("hetrl emulate")
    _run(_small_budget(emulate), tmp_path)
    assert list((tmp_path / "runs" / "c").rglob("model.safetensors"))
    section = "## SageMaker: one heterogeneous job"
    commands = _shell_commands(_blocks(page, "bash", section)[0])
    assert commands[0].startswith("pip install")  # `make test` installed every extra
    out = _run(commands[1], tmp_path).stdout
    request = json.loads(out)
    shown = _blocks(page, "json", section)[0]
    assert sorted(request) == sorted(re.findall(r'^  "(\w+)"', shown, re.M)), out
    assert request["ResourceConfig"]["InstanceGroups"] == [
        {"InstanceCount": 2, "InstanceGroupName": "env_group", "InstanceType": "ml.c5.9xlarge"},
        {"InstanceCount": 1, "InstanceGroupName": "learner_group",
         "InstanceType": "ml.g5.2xlarge"}]


# Every bash and python block of README.md and docs/, with the test that runs it.
RUN_BY = {
    "README.md": ["not run: make train and make test (CI runs `make test` itself)",
                  "test_the_readme_tour_runs_as_written", "test_the_readme_tour_runs_as_written",
                  "test_the_readme_tour_runs_as_written"],
    "docs/getting-started.md": ["test_getting_starteds_commands_and_python_run_as_written"] * 4,
    "docs/own-env.md": ["test_the_own_environment_example_runs_as_written"] * 2,
    "docs/cli.md": ["test_running_workers_and_the_learner_by_hand_works_as_written"],
    "docs/cost.md": ["test_the_cost_pages_reports_and_plan_run_as_written"],
    "docs/cluster.md": ["test_the_cluster_pages_emulation_and_dry_run_run_as_written"] * 2 + [
        "not run: docker build (the test machines have no Docker engine)"],
}


def test_no_code_block_is_left_unrun() -> None:
    """A new bash or python block in the README or the docs needs a test that runs it."""
    pages = [str(p.relative_to(ROOT)) for p in [ROOT / "README.md",
                                                 *sorted((ROOT / "docs").glob("*.md"))]]
    found = {page: len(_blocks(page, "bash")) + len(_blocks(page, "python")) for page in pages}
    assert {page: n for page, n in found.items() if n} == {
        page: len(tests) for page, tests in RUN_BY.items()}
    names = set(globals())
    assert all(t in names or t.startswith("not run: ")
               for tests in RUN_BY.values() for t in tests)
