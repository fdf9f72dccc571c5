"""Make a ``target.xnnpack_root`` from Debian's XNNPACK packages for another architecture.

    python -m etbuild.runtime_src.backends.xnnpack.debian_root arm64 ~/xnnpack-arm64
    etbuild +target=linux_aarch64 +partitioner=xnnpack target.xnnpack_root=~/xnnpack-arm64

Debian's libxnnpack and libpthreadpool packages cannot be installed beside the host's, so
this downloads them (and libcpuinfo) for ``ARCH`` with apt, in a private apt state that leaves
the system's architectures alone, and unpacks them with ``dpkg -x`` into ``DIR``
(``DIR/usr/include``, ``DIR/usr/lib/<triplet>``). Needs apt-get and dpkg (Debian, Ubuntu).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = (
    "libxnnpack0",
    "libxnnpack-dev",
    "libpthreadpool0",
    "libpthreadpool-dev",
    "libcpuinfo0",
    "libcpuinfo-dev",
)


def make_root(arch: str, root: Path) -> Path:
    """Downloads and unpacks the packages into ``root``; returns the library folder."""
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise SystemExit(f"debian_root: {tool} is not installed (Debian or Ubuntu only)")
    with tempfile.TemporaryDirectory(prefix="etb_apt_") as tmp:
        state = Path(tmp)
        for sub in ("lists/partial", "cache/archives/partial", "debs"):
            (state / sub).mkdir(parents=True)
        opts = [
            f"-oAPT::Architecture={arch}",
            f"-oAPT::Architectures::={arch}",
            f"-oDir::State::Lists={state / 'lists'}",
            f"-oDir::Cache={state / 'cache'}",
            "-oDir::State::status=/dev/null",
            "-oAPT::Sandbox::User=root",
        ]
        _run(["apt-get", *opts, "-qq", "update"], "apt-get update")
        _run(
            ["apt-get", *opts, "-qq", "download", *(f"{p}:{arch}" for p in PACKAGES)],
            "apt-get download",
            cwd=state / "debs",
        )
        root.mkdir(parents=True, exist_ok=True)
        for deb in sorted((state / "debs").glob("*.deb")):
            _run(["dpkg", "-x", str(deb), str(root)], f"dpkg -x {deb.name}")
    libs = sorted(root.glob("usr/lib/*/libXNNPACK.so*"))
    if not libs:
        raise SystemExit(f"debian_root: no libXNNPACK for {arch} was unpacked into {root}")
    return libs[0].parent


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise SystemExit(f"debian_root: {what} failed:\n{proc.stderr.strip()}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    lib = make_root(argv[0], Path(argv[1]).expanduser().resolve())
    print(f"XNNPACK for {argv[0]}: {lib}; set target.xnnpack_root={Path(argv[1]).expanduser()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
