"""The docs stand on their own: README.md points at nothing outside the repository, and the
architecture document it links exists and names every stage of the pipeline."""

from __future__ import annotations

import re
from pathlib import Path

from etbuild.pipeline.stages import STAGES

REPO = Path(__file__).resolve().parents[2]


def test_readme_links_nothing_outside_the_repository() -> None:
    text = (REPO / "README.md").read_text()
    outside = [
        m.group(0)
        for pattern in (
            r"(?<![\w.])\.\./[\w./-]*",  # a relative path that leaves the repository
            r"(?<![\w.~])/(?:work|root)/[\w./-]*",  # this machine's own folders
            r"(?<=[^\s\[])\]\((?!https?://|#)[^)]*\)",  # a Markdown link target ...
        )
        for m in re.finditer(pattern, text)
    ]
    # ... whose target is a file of the repository is fine
    outside = [
        o for o in outside if not (o.startswith("](") and (REPO / o[2:-1].split("#")[0]).exists())
    ]
    assert outside == [], f"README.md refers outside the repository: {outside}"
    assert "docs/architecture.md" in text


def test_architecture_document_names_every_stage() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    missing = [s.name for s in STAGES if not re.search(rf"\b{s.name}\b", text)]
    assert missing == [], f"docs/architecture.md does not mention the stages {missing}"
