"""Which kernel sources a build compiles: those that define the selected ops' kernels (ops_yaml
``kernel_source``, a path under runtime_src/) and the sources of the helpers they use.

A helper's source is found through its header: a file that includes ``kernels/.../X.h`` (or
includes a header that does) needs ``kernels/.../X.cpp`` where that file exists. With no
selection, or when a selected op names no ``kernel_source``, every kernel source compiles (a
tailored build is then as slow to compile as a full one, never short of a kernel).
"""

from __future__ import annotations

import re
from pathlib import Path

from .opdb import CodegenError, OpEntry

_INCLUDE = re.compile(r'^\s*#\s*include\s+"(kernels/[^"]+)"', re.M)


def all_kernel_sources(runtime_src: Path) -> list[str]:
    """Every kernel source under runtime_src/kernels, relative to runtime_src."""
    return sorted(
        p.relative_to(runtime_src).as_posix() for p in runtime_src.glob("kernels/**/*.cpp")
    )


def _closure(runtime_src: Path, roots: list[str]) -> list[str]:
    """The sources in ``roots`` and every source their includes pair with, transitively."""
    seen: set[str] = set()
    sources: set[str] = set()
    todo = list(roots)
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        path = runtime_src / rel
        if rel.endswith(".cpp"):
            sources.add(rel)
        for inc in _INCLUDE.findall(path.read_text()):
            if (runtime_src / inc).is_file():
                todo.append(inc)
            impl = str(Path(inc).with_suffix(".cpp"))
            if inc.endswith(".h") and (runtime_src / impl).is_file():
                todo.append(impl)
    return sorted(sources)


def kernel_sources(entries: list[OpEntry], runtime_src: Path) -> list[str]:
    """The kernel sources (relative to runtime_src) that the ops ``entries`` need."""
    everything = all_kernel_sources(runtime_src)
    if any(not e.kernel_source for e in entries):
        return everything
    roots = sorted({e.kernel_source for e in entries})
    for rel in roots:
        if rel not in everything:
            owners = ", ".join(e.schema.key for e in entries if e.kernel_source == rel)
            raise CodegenError(
                f"{owners}: kernel_source {rel} is not a kernel source under {runtime_src} "
                "(a path like kernels/portable/elementwise.cpp)"
            )
    return _closure(runtime_src, roots)
