"""``etbuild-recipe``: list, show, validate and compare recipes (pipeline/recipes.py)."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import yaml

from .errors import EtbuildError
from .recipes import ENTRY_POINT_GROUP, ENV_VAR, available, compose, find, flatten, resolved


def _list(_args: argparse.Namespace) -> int:
    rows = [(r.name, r.version, r.description, f"{r.origin}: {r.path}") for r in available()]
    if not rows:
        print("no recipes on the search path")
        return 0
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    for name, version, description, where in rows:
        print(f"{name:<{widths[0]}}  {version:<{widths[1]}}  {description}")
        print(f"{'':<{widths[0]}}  {'':<{widths[1]}}  from {where}")
    return 0


def _show(args: argparse.Namespace) -> int:
    recipe = find(args.name)
    cfg = compose(recipe, args.overrides)
    print(f"# {recipe.name} {recipe.version} ({recipe.origin}): {recipe.path}")
    if recipe.description:
        print(f"# {recipe.description}")
    print(yaml.safe_dump(resolved(cfg), sort_keys=False), end="")
    return 0


def _validate(args: argparse.Namespace) -> int:
    recipe = find(args.path)
    compose(recipe, args.overrides)  # the header, composition and the schema's checks
    print(f"{recipe.path}: ok ({recipe.name} {recipe.version})")
    return 0


def _short(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def _diff(args: argparse.Namespace) -> int:
    a, b = find(args.a), find(args.b)
    left = flatten(resolved(compose(a)))
    right = flatten(resolved(compose(b)))
    keys = [k for k in left if k != "recipe" and not k.startswith("recipe.")]
    keys += [k for k in right if k not in left and not k.startswith("recipe.")]
    changed = [k for k in keys if left.get(k, "<absent>") != right.get(k, "<absent>")]
    print(f"--- {a.name} {a.version}: {a.path}")
    print(f"+++ {b.name} {b.version}: {b.path}")
    if not changed:
        print("the resolved configs are the same")
        return 0
    width = max(len(k) for k in changed)
    for key in changed:
        lv = _short(left[key]) if key in left else "(absent)"
        rv = _short(right[key]) if key in right else "(absent)"
        print(f"{key:<{width}}  {lv}  ->  {rv}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="etbuild-recipe",
        description=(
            "List, show, validate and compare etbuild recipes. Recipes are found by name in "
            f"etbuild's packaged recipes, the folders of ${ENV_VAR} and the packages of the "
            f"entry point group {ENTRY_POINT_GROUP}; a NAME may also be a recipe file's path. "
            "Build one with: etbuild --recipe NAME [overrides]"
        ),
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="every recipe: name, version, description, where it comes from")
    show = sub.add_parser("show", help="a recipe's file and its resolved config")
    show.add_argument("name", metavar="NAME")
    show.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides, as for etbuild")
    val = sub.add_parser("validate", help="check a recipe's header, composition and schema")
    val.add_argument("path", metavar="PATH", help="a recipe file (or a recipe's name)")
    val.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides, as for etbuild")
    diff = sub.add_parser("diff", help="the resolved configs of two recipes, key by key")
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")
    return p


def main(argv: list[str] | None = None) -> None:
    warnings.filterwarnings("ignore", category=UserWarning, module="hydra")
    args = parser().parse_args(argv)
    run = {"list": _list, "show": _show, "validate": _validate, "diff": _diff}[args.command]
    try:
        code = run(args)
    except EtbuildError as exc:
        print(f"etbuild-recipe: error: {exc}", file=sys.stderr)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
