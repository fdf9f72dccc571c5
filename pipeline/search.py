"""A search: what a build returns to a search sweeper (``hydra/sweeper=optuna``).

In a multirun, the etbuild app returns one number per ``search.objectives`` entry, read from
the job's manifest ``metrics`` (``latency_ms``: the runner's median; ``size_kb``: program +
runtime; ``program_kb``; ``planned_kb``: every bank; ``sqnr_db``: against fp32, an fp32 build
counting as ``search.fp32_sqnr_db``). A job that failed, lacks a metric an objective needs, or
breaks a constraint (``search.max_size_kb``, ``search.max_latency_ms``, ``search.min_sqnr_db``)
is *infeasible*: it returns ``search.penalty`` for every minimized objective and
``-search.penalty`` for every maximized one, so it is dominated by every feasible build and
never reaches the Pareto set (unless nothing is feasible). Each job writes ``search.json``
(its values, feasibility and the violated constraints); ``sweep.md`` lists the infeasible
jobs and the Pareto set the sweeper reports (``optimization_results.yaml``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .errors import EtbuildError

DIRECTIONS = {
    "latency_ms": "minimize",
    "size_kb": "minimize",
    "program_kb": "minimize",
    "planned_kb": "minimize",
    "sqnr_db": "maximize",
}
RESULT_NAME = "search.json"


def _metric(name: str, metrics: dict[str, Any], quantized: bool, fp32_sqnr: float):
    """(value, why it is unknown)."""
    if name == "latency_ms":
        lat = metrics.get("latency_ms")
        if isinstance(lat, dict) and lat.get("median") is not None:
            return float(lat["median"]), None
        return None, "no latency (pipeline.verify on a target that runs here, latency_iters > 1)"
    if name in ("size_kb", "program_kb"):
        program = metrics.get("program_bytes")
        runtime = metrics.get("runtime_bytes") if name == "size_kb" else 0
        if program is None or runtime is None:
            return None, f"no {'runtime and ' if name == 'size_kb' else ''}program size"
        return (program + runtime) / 1024, None
    if name == "planned_kb":
        total = metrics.get("planned_total_bytes")
        return (None, "no memory plan") if total is None else (total / 1024, None)
    if name == "sqnr_db":
        if not quantized:
            return float(fp32_sqnr), None
        sqnr = metrics.get("sqnr_db")
        return (None, "no SQNR (the verify stage measures it)") if sqnr is None else (sqnr, None)
    raise EtbuildError(f"search.objectives: unknown objective {name!r}")


def evaluate(search: DictConfig, manifest: dict[str, Any] | None) -> dict[str, Any]:
    """The values a job returns, its feasibility and why it is infeasible."""
    objectives = [getattr(o, "value", o) for o in search.objectives]
    penalty = float(search.penalty)
    worst = [penalty if DIRECTIONS[o] == "minimize" else -penalty for o in objectives]
    violations: list[str] = []
    if manifest is None or manifest.get("status") != "ok":
        error = (manifest or {}).get("error") or "no manifest"
        violations.append(f"the build failed: {str(error).strip().splitlines()[0]}")
        return {"objectives": objectives, "values": worst, "feasible": False,
                "violations": violations, "measured": {}}  # fmt: skip
    metrics = manifest.get("metrics") or {}
    scheme = ((manifest.get("config") or {}).get("quant") or {}).get("scheme")
    quantized = scheme not in (None, "none")
    measured: dict[str, float] = {}
    needed = set(objectives)
    for key, limit in (("size_kb", search.max_size_kb), ("latency_ms", search.max_latency_ms),
                       ("sqnr_db", search.min_sqnr_db)):  # fmt: skip
        if limit is not None:
            needed.add(key)
    for name in sorted(needed):
        value, why = _metric(name, metrics, quantized, search.fp32_sqnr_db)
        if value is None:
            violations.append(f"{name} unknown: {why}")
        else:
            measured[name] = round(float(value), 6)
    checks = (
        ("size_kb", search.max_size_kb, lambda v, lim: v <= lim, "max_size_kb"),
        ("latency_ms", search.max_latency_ms, lambda v, lim: v <= lim, "max_latency_ms"),
        ("sqnr_db", search.min_sqnr_db, lambda v, lim: v >= lim, "min_sqnr_db"),
    )
    for name, limit, ok, key in checks:
        if limit is not None and name in measured and not ok(measured[name], limit):
            violations.append(f"{name}={measured[name]:g} breaks search.{key}={limit:g}")
    feasible = not violations
    values = [measured[o] for o in objectives] if feasible else worst
    return {"objectives": objectives, "values": values, "feasible": feasible,
            "violations": violations, "measured": measured}  # fmt: skip


def job_result(run_dir: Path, search: DictConfig) -> list[float]:
    """Evaluate a finished job (its manifest.json), write search.json, return the values."""
    from .runner import write_atomic

    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = None
    result = evaluate(search, manifest)
    write_atomic(run_dir / RESULT_NAME, (json.dumps(result, indent=2) + "\n").encode())
    return [float(v) for v in result["values"]]


def check_directions(config: DictConfig) -> None:
    """An Optuna sweep's ``hydra.sweeper.direction`` must match ``search.objectives``."""
    from omegaconf import OmegaConf

    sweeper = OmegaConf.select(config, "hydra.sweeper")
    objectives = OmegaConf.select(config, "search.objectives")
    if sweeper is None or objectives is None:
        return
    if "optuna" not in str(sweeper.get("_target_", "")).lower():
        return
    objectives = [getattr(o, "value", o) for o in objectives]
    want = [DIRECTIONS[o] for o in objectives]
    direction = sweeper.get("direction")
    given = [str(direction)] if isinstance(direction, str) else [str(d) for d in direction or []]
    given = [d.split(".")[-1].lower() for d in given]
    if given != want:
        raise EtbuildError(
            f"hydra.sweeper.direction={given} does not match search.objectives={objectives}: "
            f"set hydra.sweeper.direction=[{','.join(want)}] (one entry per objective, in order)"
        )
