"""Progress of a long step inside a stage (the C++ build, calibration).

On a terminal it is a bar (rich) that disappears when the step ends, leaving the stage's own
progress line; otherwise (a log file, CI, a pipe) it is a plain line at each quarter once the
step has run for ``after_s`` seconds, so a log shows that a long build is moving without one
line per compiled file, and a quick step prints nothing.

``NinjaLog`` reads ninja's ``[done/total]`` status lines from the build's log file while the
build runs (pipeline/process_group.py polls it).
"""

from __future__ import annotations

import re
import sys
import time
from typing import IO, Any

NINJA_STATUS = re.compile(rb"^\[(\d+)/(\d+)\]", re.M)


class Progress:
    """``with Progress("calibrating", total=n) as p: ... p.update(done)``."""

    def __init__(
        self,
        what: str,
        total: int | None = None,
        stream: IO[str] | None = None,
        after_s: float = 2.0,
    ) -> None:
        self.what, self.total, self.after_s = what, total, after_s
        self.started = time.monotonic()
        self.stream = stream if stream is not None else sys.stdout
        self._bar: Any = None
        self._task: Any = None
        self._quarter = 0  # the last quarter a plain line was printed for

    def __enter__(self) -> Progress:
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("  {task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total)
        return self

    def update(self, done: int, total: int | None = None) -> None:
        if total is not None and total != self.total:
            self.total, self._quarter = total, 0  # a new ninja run
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=self.total)
            return
        if not self.total or time.monotonic() - self.started < self.after_s:
            return
        quarter = min(4, done * 4 // self.total)
        if quarter > self._quarter:
            self._quarter = quarter
            print(f"  {self.what}: {done}/{self.total}", file=self.stream, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


class NinjaLog:
    """Follows a build log, passing ninja's latest ``[done/total]`` to a Progress."""

    def __init__(self, path: str, progress: Progress) -> None:
        self.path, self.progress, self.offset = path, progress, 0
        self.tail = b""  # a line not yet complete

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        text, _, self.tail = (self.tail + data).rpartition(b"\n")
        found = NINJA_STATUS.findall(text)
        if found:
            done, total = found[-1]
            self.progress.update(int(done), int(total))
