"""Where a cluster job's lines go: one prefixed stream on the container's stdout, plus files.

Only a container's stdout and stderr reach CloudWatch, so on a cluster host every line of
every process (the host's own, each rollout worker's, the learner's) is written there
with a `[host role]` prefix, and also to a per-process file under `<base>/hetrl/logs/`.
At exit those files are copied into `<base>/output/data/<host>/`, which SageMaker packs
into the job's output.tar.gz (one folder per host, so hosts never overwrite each other).
`PrefixedStream` does this for the host process (it replaces sys.stdout and sys.stderr);
`pump` does it for a child's piped output. This module starts no processes.
"""

from __future__ import annotations

import io
import shutil
import sys
import threading
from pathlib import Path
from typing import IO, TextIO

_write_lock = threading.Lock()  # whole lines from every thread, never interleaved


class PrefixedStream(io.TextIOBase):
    """A text stream that writes each complete line, prefixed, to `echo` and to `file`."""

    def __init__(self, prefix: str, echo: TextIO, file: TextIO | None) -> None:
        self.prefix, self.echo, self.file = prefix, echo, file
        self._partial = ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:  # lines, never a rewritten progress line
        return False

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        if lines:
            self._emit([line + "\n" for line in lines])
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self._emit([self._partial + "\n"])
            self._partial = ""

    def _emit(self, lines: list[str]) -> None:
        with _write_lock:
            for line in lines:
                self.echo.write(self.prefix + line)
                if self.file is not None:
                    self.file.write(line)
            self.echo.flush()
            if self.file is not None:
                self.file.flush()


def tee_host_output(prefix: str, log_file: Path) -> None:
    """From now on this process's stdout and stderr go, prefixed, to the container's
    stdout and stderr, and unprefixed to `log_file` (appended)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    file = log_file.open("a", encoding="utf-8", errors="replace")
    sys.stdout = PrefixedStream(prefix, sys.__stdout__ or file, file)
    sys.stderr = PrefixedStream(prefix, sys.__stderr__ or file, file)


def pump(pipe: IO[bytes], log_path: Path | None, prefix: str,
         echo: TextIO | None = None) -> threading.Thread:
    """Copy a child's output, line by line, to `log_path` and (prefixed) to `echo` (if
    any) until the child closes it; return the thread."""

    def run() -> None:
        file = log_path.open("ab") if log_path is not None else None
        try:
            for raw in iter(pipe.readline, b""):
                text = raw.decode("utf-8", errors="replace")
                if not text.endswith("\n"):
                    text += "\n"
                target = echo
                with _write_lock:
                    if file is not None:
                        file.write(raw)
                        file.flush()
                    if target is not None:
                        target.write(prefix + text)
                        target.flush()
        except (OSError, ValueError):
            pass  # our stdout went away: the child's own file still has its lines
        finally:
            pipe.close()
            if file is not None:
                file.close()

    thread = threading.Thread(target=run, name=f"log {prefix.strip()}", daemon=True)
    thread.start()
    return thread


def keep_logs(base_dir: Path, host: str) -> Path | None:
    """Copy every per-process log of this host into `<base>/output/data/<host>/`, so it
    reaches the job's output.tar.gz; return that folder (None when there was nothing)."""
    logs = base_dir / "hetrl" / "logs"
    if not logs.is_dir():
        return None
    into = base_dir / "output" / "data" / host
    try:
        into.mkdir(parents=True, exist_ok=True)
        for path in sorted(logs.glob("*.log")):
            shutil.copyfile(path, into / path.name)
    except OSError as exc:
        print(f"hetrl: could not copy the logs into {into}: {exc}", file=sys.stderr)
        return None
    return into
