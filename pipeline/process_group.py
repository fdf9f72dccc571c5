"""Long child processes (the C++ build: cmake, ninja and its compilers) that die with etbuild.

``run(cmd, ...)`` starts ``cmd`` under a small supervisor (this module run as a script) that
leads a process group of its own. The supervisor kills the whole group when etbuild exits
abnormally: on Linux it gets SIGTERM the moment etbuild dies, even by SIGKILL
(``PR_SET_PDEATHSIG``); and when etbuild is interrupted (Ctrl-C, an exception) ``run`` kills
the group itself. So no compiler outlives a killed build.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:  # this file also runs as a script (the supervisor): no package imports
    from .progress import Progress

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int):
    def setup() -> None:  # in the supervisor, between fork and exec
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):  # not Linux: Ctrl-C and exceptions still kill
            return
        if os.getppid() != parent:  # etbuild died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return setup


def run(
    cmd: list[str], stdout: IO[bytes], cwd: str | None = None, progress: Progress | None = None
) -> int:
    """Runs ``cmd`` in a process group that dies with etbuild; returns its exit code. With a
    ``progress``, ninja's status lines in ``stdout`` (a log file) drive it while it runs."""
    proc = subprocess.Popen(
        [sys.executable, __file__, *cmd],
        stdout=stdout,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        start_new_session=True,  # the supervisor leads the group the build runs in
        preexec_fn=_die_with_parent(os.getpid()),
    )
    follow = None
    if progress is not None:
        from .progress import NinjaLog

        follow = NinjaLog(stdout.name, progress)
    try:
        while follow is not None:
            try:
                code = proc.wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                follow.poll()
                continue
            follow.poll()  # the last lines
            return code
        return proc.wait()
    except BaseException:  # interrupted: stop the build before etbuild goes
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        raise


def _supervise(cmd: list[str]) -> int:
    def stop(_signum, _frame) -> None:
        os.killpg(0, signal.SIGKILL)  # the group: the command, its children and this one

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        child = subprocess.Popen(cmd)
    except OSError as exc:
        print(f"etbuild: cannot run {cmd[0]}: {exc}", file=sys.stderr)
        return 127
    return child.wait()


if __name__ == "__main__":
    sys.exit(_supervise(sys.argv[1:]))
