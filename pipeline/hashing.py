"""The content hashes etbuild keys its caches and its manifest with (sha256, hex)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_json(doc: Any) -> str:
    """The digest of JSON data (keys sorted; what JSON cannot say is written with ``str``)."""
    return sha256_bytes(json.dumps(doc, sort_keys=True, default=str).encode())


def tree_digest(h: Any, root: Path, patterns: tuple[str, ...]) -> None:
    """Feed every file under ``root`` matching ``patterns`` (path and bytes) into ``h``."""
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode() + b"\0")
                h.update(path.read_bytes() + b"\0")
