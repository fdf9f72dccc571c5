"""The element types of the program format, read from the program schema.

``runtime_src/schema/scalar_type.fbs`` is the one table of dtype names and codes (ExecuTorch's
numbering, which is c10's). ops_yaml's dtype names are checked against it here, the Python
pipeline takes its codes from it (``pipeline/scalar_types.py`` adds only the torch dtype of
each name), and the C++ enum (``core/scalar_type.h``) is checked against the flatc-generated
enum at compile time. PyYAML-free and torch-free, so the build can use it.
"""

from __future__ import annotations

import re
from pathlib import Path

SCALAR_TYPE_FBS = (
    Path(__file__).resolve().parent.parent / "runtime_src" / "schema" / "scalar_type.fbs"
)


def read_scalar_types(fbs: Path = SCALAR_TYPE_FBS) -> dict[str, int]:
    """``{name: code}`` of the ``ScalarType`` enum in ``fbs``, in declaration order."""
    body = re.search(r"enum\s+ScalarType\s*:\s*\w+\s*\{(.*?)\}", fbs.read_text(), re.S)
    if body is None:
        raise ValueError(f"{fbs} declares no 'enum ScalarType'")
    text = re.sub(r"//[^\n]*", "", body.group(1))
    return {name: int(code) for name, code in re.findall(r"(\w+)\s*=\s*(\d+)", text)}


SCALAR_TYPES: dict[str, int] = read_scalar_types()
