"""Progress of long steps: plain quarter lines off a terminal, a bar on one, and ninja's
status lines followed in a running build's log (etbuild.pipeline.progress)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from etbuild.pipeline import process_group
from etbuild.pipeline.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_long_step_prints_a_line_per_quarter() -> None:
    out = io.StringIO()
    with Progress("calibrating", total=10, stream=out, after_s=0) as p:
        for i in range(1, 11):
            p.update(i)
    assert out.getvalue().splitlines() == [
        "  calibrating: 3/10",
        "  calibrating: 5/10",
        "  calibrating: 8/10",
        "  calibrating: 10/10",
    ]


def test_a_quick_step_prints_nothing() -> None:
    out = io.StringIO()
    with Progress("calibrating", total=4, stream=out) as p:  # done well within 2 s
        for i in range(1, 5):
            p.update(i)
    assert out.getvalue() == ""


def test_on_a_terminal_it_draws_a_bar() -> None:
    out = Terminal()
    with Progress("building the runtime (ninja)", total=8, stream=out) as p:
        p.update(4)
    assert "building the runtime (ninja)" in out.getvalue()


def test_ninja_status_lines_of_a_running_build_drive_the_progress(tmp_path: Path) -> None:
    """The build's output goes to its log file; the progress follows it while it runs (each
    status line a quarter apart in time, so the follower sees them as they come)."""
    script = (
        "import sys, time\n"
        "for i in range(1, 5):\n"
        "    print(f'[{i}/4] Building CXX object k{i}.o', flush=True); time.sleep(0.4)\n"
    )
    out = io.StringIO()
    seen: list[tuple[int, int | None]] = []

    class Recorder(Progress):
        def update(self, done: int, total: int | None = None) -> None:
            seen.append((done, total))
            super().update(done, total)

    log = tmp_path / "build.log"
    with open(log, "ab") as f, Recorder("building", stream=out, after_s=0) as p:
        assert process_group.run([sys.executable, "-c", script], f, progress=p) == 0
    assert all(total == 4 for _, total in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len({d for d, _ in seen}) >= 3
    assert seen[-1] == (4, 4)  # the last lines are read once the build has exited
    assert out.getvalue().splitlines()[-1] == "  building: 4/4"
