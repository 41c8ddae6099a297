"""A cluster host's lines: prefixed on the container's stdout, whole in per-process files,
and kept in the job's output."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from hetrl.launch.logs import PrefixedStream, keep_logs
from hetrl.launch.processes import spawn_command, stop_all


def test_prefixed_stream_writes_whole_lines_to_both() -> None:
    echo, file = io.StringIO(), io.StringIO()
    stream = PrefixedStream("[algo-1 env-host] ", echo, file)
    stream.write("first li")
    assert echo.getvalue() == ""  # a partial line waits for its end
    stream.write("ne\nsecond\nthi")
    stream.flush()
    assert echo.getvalue() == ("[algo-1 env-host] first line\n[algo-1 env-host] second\n"
                               "[algo-1 env-host] thi\n")
    assert file.getvalue() == "first line\nsecond\nthi\n"
    assert not stream.isatty()


def test_a_childs_output_reaches_its_file_and_the_prefixed_stream(tmp_path: Path) -> None:
    echo = io.StringIO()
    code = "import sys; print('out'); print('err', file=sys.stderr); print('no newline', end='')"
    child = spawn_command("worker-0", [sys.executable, "-c", code], {},
                          tmp_path / "logs" / "worker-0.log", echo=echo,
                          echo_prefix="[algo-3 worker-0] ")
    assert child.process.wait(60) == 0
    stop_all([child], 5.0)  # joins the pump
    lines = echo.getvalue().splitlines()
    assert sorted(lines) == ["[algo-3 worker-0] err", "[algo-3 worker-0] no newline",
                             "[algo-3 worker-0] out"]
    assert sorted(child.log_tail().splitlines()) == ["err", "no newline", "out"]


def test_logs_are_kept_in_the_hosts_own_output_folder(tmp_path: Path) -> None:
    assert keep_logs(tmp_path, "algo-1") is None  # nothing logged, nothing made
    logs = tmp_path / "hetrl" / "logs"
    logs.mkdir(parents=True)
    (logs / "worker-0.log").write_text("w\n")
    (logs / "env-host.log").write_text("h\n")
    kept = keep_logs(tmp_path, "algo-1")
    assert kept == tmp_path / "output" / "data" / "algo-1"
    assert (kept / "worker-0.log").read_text() == "w\n"
    assert (kept / "env-host.log").read_text() == "h\n"
