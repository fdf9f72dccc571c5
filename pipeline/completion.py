"""Tab completion of etbuild's own flags, in front of Hydra's.

Hydra's completion (``etbuild -sc install=bash``) completes config groups, options and keys:
the shell calls ``etbuild -sc query=bash`` with the line in ``COMP_LINE``. etbuild answers first
when the word being completed is its own: a recipe name after ``--recipe``, a file after
``--lock`` (the shell's file completion: etbuild offers nothing), or a flag. Otherwise it takes
``--recipe NAME`` / ``--lock FILE`` out of the line and hands them to the command's arguments,
where they choose the config as in a build, so Hydra completes the recipe's own keys.
"""

from __future__ import annotations

from collections.abc import Sequence

# Flags offered for a word that starts with "-": etbuild's own and Hydra's common ones.
FLAGS = ("--recipe", "--lock", "--multirun", "--version", "--help", "--hydra-help", "--cfg")
TAKE_VALUE = ("--recipe", "--lock")


def query_shell(args: Sequence[str]) -> str | None:
    """The shell asking for completions (``-sc query=SHELL``), or None: not a query."""
    for i, a in enumerate(args[:-1]):
        if a in ("-sc", "--shell-completion") and args[i + 1].startswith("query="):
            return args[i + 1].split("=", 1)[1]
    return None


def answer(choices: Sequence[str], shell: str) -> str:
    """Choices as the shell's completion script reads them (fish: one per line)."""
    return ("\n" if shell == "fish" else " ").join(choices)


def _words(line: str) -> tuple[list[str], str]:
    """The words before the one being completed, and that word ("" after a space)."""
    words = line.split()
    if not words or line[-1:].isspace():
        return words, ""
    return words[:-1], words[-1]


def own_choices(line: str) -> list[str] | None:
    """etbuild's completions for ``line``, or None when the word is Hydra's to complete."""
    from .recipes import available

    before, word = _words(line)
    previous = before[-1] if len(before) > 1 else ""
    if previous == "--recipe":
        return [r.name for r in available()]
    if previous == "--lock":
        return []  # the shell falls back to file names
    if word.startswith("--recipe="):
        return [f"--recipe={r.name}" for r in available()]
    if word.startswith("--lock="):
        return []
    if word.startswith("-"):
        return [f for f in FLAGS if f.startswith(word)]
    return None


def split_line(line: str) -> tuple[str, list[str]]:
    """``line`` without its ``--recipe NAME`` and ``--lock FILE`` (both spellings), and those
    flags as arguments for the command. The word being completed stays where it is."""
    before, word = _words(line)
    kept, taken = before[:1], []
    rest = before[1:]
    i = 0
    while i < len(rest):
        w = rest[i]
        if w in TAKE_VALUE and i + 1 < len(rest):
            taken += rest[i : i + 2]
            i += 2
            continue
        if w.split("=", 1)[0] in TAKE_VALUE and "=" in w:
            taken.append(w)
        else:
            kept.append(w)
        i += 1
    return " ".join(kept) + " " + word, taken
