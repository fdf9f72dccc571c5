"""A sweep's results: after a multirun, one table that compares its jobs.

``SweepCallback`` is a Hydra callback (``conf/config.yaml`` registers it under
``hydra.callbacks``). When the multirun ends it reads every job's ``manifest.json`` in the
sweep directory and writes there:

- ``sweep.md``: per job its overrides, status, latency, runtime and program size, planned
  memory per bank and SQNR; the Pareto front; the failed jobs with their errors;
- ``sweep.csv``: the same table, one row per job, for a spreadsheet or pandas;
- ``pareto.png``: latency against size (program + runtime), coloured by SQNR.

Everything comes from the files the jobs wrote (``.hydra/overrides.yaml`` and
``manifest.json``), never from the launching process's memory, so it works the same whichever
launcher ran the jobs (in this process, in worker processes, on a cluster sharing the sweep
directory). A job counts as failed unless its manifest says ``"status": "ok"``: a job that
stopped, was killed or wrote no manifest fails the sweep, and the command exits 1 after
writing the results.

The Pareto front is over the jobs that ran here with a measured latency (not under an
emulator, whose times say nothing about the device): a job is on it when no other job is at
least as fast, at least as small and at least as accurate, and better in one of them. Accuracy
is the SQNR against the fp32 model; it counts when some job is quantized, and an fp32 build
(no quantization error) is then the most accurate.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

OK = "ok"


@dataclass
class JobResult:
    """One sweep job as its files describe it."""

    run_dir: Path
    num: int | None
    overrides: list[str]
    status: str
    error: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    quantized: bool = False
    on_front: bool = False
    # search.json (pipeline/search.py): what the job returned to a search sweeper.
    search: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def latency_ms(self) -> float | None:
        lat = self.metrics.get("latency_ms")
        return lat.get("median") if isinstance(lat, dict) else None

    @property
    def emulated(self) -> bool:
        lat = self.metrics.get("latency_ms")
        return bool(lat.get("emulated")) if isinstance(lat, dict) else False

    @property
    def size_bytes(self) -> int | None:
        """What the device stores: the program plus the runtime (None when either is unknown)."""
        program, runtime = self.metrics.get("program_bytes"), self.metrics.get("runtime_bytes")
        return None if program is None or runtime is None else program + runtime

    @property
    def sqnr_db(self) -> float | None:
        return self.metrics.get("sqnr_db")

    @property
    def label(self) -> str:
        return "?" if self.num is None else str(self.num)


@dataclass
class SweepSummary:
    """Every job of a sweep directory, and which of them form the Pareto front."""

    sweep_dir: Path
    jobs: list[JobResult]
    uses_accuracy: bool
    banks: list[str]
    # A search sweeper's optimization_results.yaml (Optuna), when the sweep was a search.
    optimization: dict[str, Any] | None = None

    @property
    def failed(self) -> list[JobResult]:
        return [j for j in self.jobs if not j.ok]

    @property
    def front(self) -> list[JobResult]:
        return [j for j in self.jobs if j.on_front]


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job directories under ``sweep_dir``: those holding ``.hydra/overrides.yaml`` (a job
    subdir may contain slashes, so at any depth)."""
    found = {
        p.parent.parent for p in sweep_dir.rglob("overrides.yaml") if p.parent.name == ".hydra"
    }
    return sorted(found)


def _job_num(job_dir: Path) -> int | None:
    try:
        doc = yaml.safe_load((job_dir / ".hydra" / "hydra.yaml").read_text())
        return int(doc["hydra"]["job"]["num"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return None


def read_job(job_dir: Path) -> JobResult:
    """A job's overrides, status, error and metrics from its files."""
    try:
        overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or []
    except (OSError, yaml.YAMLError):
        overrides = []
    job = JobResult(job_dir, _job_num(job_dir), [str(o) for o in overrides], "no manifest")
    path = job_dir / "manifest.json"
    if not path.is_file():
        job.error = "no manifest.json: the job stopped before the pipeline started (see its log)"
        return job
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        job.status, job.error = "unreadable manifest", f"manifest.json cannot be read: {exc}"
        return job
    job.status = str(manifest.get("status", "unknown"))
    job.error = manifest.get("error")
    if job.status == "running":
        job.status = "unfinished"
        job.error = "the job never finished (killed, or its process died) after it started"
    elif not job.ok and not job.error:
        job.error = f"status {job.status!r}"
    job.metrics = manifest.get("metrics") or {}
    try:
        job.search = json.loads((job_dir / "search.json").read_text())
    except (OSError, ValueError):
        job.search = None
    scheme = ((manifest.get("config") or {}).get("quant") or {}).get("scheme")
    job.quantized = scheme not in (None, "none")
    return job


def _accuracy(job: JobResult) -> float:
    if not job.quantized:
        return math.inf  # fp32: no quantization error
    return job.sqnr_db if job.sqnr_db is not None else -math.inf


def mark_front(jobs: list[JobResult]) -> bool:
    """Mark the Pareto front of latency vs size (vs accuracy when some candidate is
    quantized); returns whether accuracy counted."""
    candidates = [
        j
        for j in jobs
        if j.ok and j.latency_ms is not None and j.size_bytes is not None and not j.emulated
    ]
    uses_accuracy = any(j.quantized for j in candidates)

    def costs(j: JobResult) -> tuple[float, ...]:
        base = (j.latency_ms, float(j.size_bytes))
        return (*base, -_accuracy(j)) if uses_accuracy else base

    for j in jobs:
        j.on_front = False
    for j in candidates:
        mine = costs(j)
        j.on_front = not any(
            all(a <= b for a, b in zip(costs(o), mine, strict=True)) and costs(o) != mine
            for o in candidates
            if o is not j
        )
    return uses_accuracy


def summarize(sweep_dir: Path, dirs: list[Path] | None = None) -> SweepSummary:
    """Read the jobs in ``dirs`` (default: every job directory under ``sweep_dir``)."""
    jobs = [read_job(d) for d in (job_dirs(sweep_dir) if dirs is None else dirs)]
    jobs.sort(key=lambda j: (j.num is None, j.num if j.num is not None else 0, str(j.run_dir)))
    uses_accuracy = mark_front(jobs)
    banks: list[str] = []
    for j in jobs:
        for bank in j.metrics.get("planned_bytes") or {}:
            if bank not in banks:
                banks.append(bank)
    optimization = None
    results = sweep_dir / "optimization_results.yaml"
    if results.is_file():
        try:
            optimization = yaml.safe_load(results.read_text())
        except (OSError, yaml.YAMLError):
            optimization = None
    return SweepSummary(sweep_dir, jobs, uses_accuracy, banks, optimization)


def _solution_jobs(params: dict[str, Any], jobs: list[JobResult]) -> list[JobResult]:
    """The jobs whose overrides set every parameter of a search solution."""
    wanted = {f"{k}={v}" for k, v in params.items()}
    return [j for j in jobs if wanted <= set(j.overrides)]


def search_lines(summary: SweepSummary) -> list[str]:
    """sweep.md's section for a search: each job's objectives, the infeasible jobs and the
    Pareto set the sweeper reported (optimization_results.yaml)."""
    searched = [j for j in summary.jobs if j.search is not None]
    if not searched and summary.optimization is None:
        return []
    objectives = (searched[0].search or {}).get("objectives", []) if searched else []
    lines = ["", f"## Search: {', '.join(objectives) or 'objectives'}", ""]
    if searched:
        lines += [
            "| job | overrides | " + " | ".join(objectives) + " | feasible |",
            "|---|---|" + "---|" * len(objectives) + "---|",
        ]
        for j in searched:
            sr = j.search or {}
            measured = sr.get("measured") or {}
            cells = [_num(measured.get(o)) for o in objectives]
            lines.append(
                f"| {j.label} | {' '.join(f'`{_md_escape(o)}`' for o in j.overrides)} | "
                + " | ".join(cells)
                + f" | {'yes' if sr.get('feasible') else '**no**'} |"
            )
        infeasible = [j for j in searched if not (j.search or {}).get("feasible")]
        if infeasible:
            lines += [
                "",
                "Infeasible (they returned search.penalty, so every feasible trial dominates "
                "them):",
            ]
            for j in infeasible:
                why = "; ".join((j.search or {}).get("violations") or []) or "?"
                lines.append(f"- job {j.label}: {_md_escape(why)}")
    opt = summary.optimization
    if opt is not None:
        lines += ["", "### Pareto set (the sweeper's optimization_results.yaml)", ""]
        solutions = opt.get("solutions")
        if solutions is None and "best_params" in opt:  # a single objective
            solutions = [{"params": opt.get("best_params"), "values": [opt.get("best_value")]}]
        for sol in solutions or []:
            params = sol.get("params") or {}
            values = sol.get("values") or []
            matched = _solution_jobs(params, summary.jobs)
            tag = ", ".join(
                f"job {j.label}"
                + ("" if (j.search or {}).get("feasible", True) else ", infeasible")
                for j in matched
            )
            tag = tag or "no job directory matches"
            names = (
                objectives
                if len(objectives) == len(values)
                else [f"value {i}" for i in range(len(values))]
            )
            shown = ", ".join(f"{name}={_num(v)}" for name, v in zip(names, values, strict=True))
            param_text = " ".join(f"`{k}={v}`" for k, v in params.items()) or "(no parameters)"
            lines.append(f"- {param_text}: {shown} ({tag})")
        if not solutions:
            lines.append("The sweeper reported no solution.")
        elif searched and not any((j.search or {}).get("feasible") for j in searched):
            lines += ["", "No trial was feasible: relax the search constraints or widen the "
                      "parameters."]  # fmt: skip
    return lines


# --- the three files --------------------------------------------------------------------


def _common_overrides(jobs: list[JobResult]) -> list[str]:
    if not jobs:
        return []
    common = set(jobs[0].overrides)
    for j in jobs[1:]:
        common &= set(j.overrides)
    return [o for o in jobs[0].overrides if o in common]


def _kib(n: int | None) -> str:
    return "" if n is None else f"{n / 1024:,.1f}"


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return ""
    return "inf" if math.isinf(x) else f"{x:.{digits}f}"


def _sqnr_cell(j: JobResult) -> str:
    if j.sqnr_db is not None:
        return _num(j.sqnr_db, 2)
    return "fp32" if j.ok and not j.quantized else ""


def _latency_cell(j: JobResult) -> str:
    if j.latency_ms is None:
        return ""
    return _num(j.latency_ms) + (" (emulated)" if j.emulated else "")


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def csv_text(summary: SweepSummary) -> str:
    """sweep.csv: one row per job; sizes in bytes, latency in milliseconds."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    banks = [f"planned_{b}_bytes" for b in summary.banks]
    w.writerow(
        [
            "job",
            "overrides",
            "status",
            "latency_ms",
            "latency_p10_ms",
            "latency_p90_ms",
            "latency_emulated",
            "runtime_bytes",
            "program_bytes",
            "size_bytes",
            *banks,
            "planned_total_bytes",
            "sqnr_db",
            "top1_agreement",
            "pareto",
            "run_dir",
            "error",
        ]
    )
    for j in summary.jobs:
        lat = j.metrics.get("latency_ms") if isinstance(j.metrics.get("latency_ms"), dict) else {}
        planned = j.metrics.get("planned_bytes") or {}
        w.writerow(
            [
                j.label,
                " ".join(j.overrides),
                j.status,
                lat.get("median", ""),
                lat.get("p10", ""),
                lat.get("p90", ""),
                str(lat.get("emulated", "")).lower(),
                j.metrics.get("runtime_bytes", ""),
                j.metrics.get("program_bytes", ""),
                "" if j.size_bytes is None else j.size_bytes,
                *(planned.get(b, "") for b in summary.banks),
                j.metrics.get("planned_total_bytes", ""),
                "" if j.sqnr_db is None else j.sqnr_db,
                j.metrics.get("top1_agreement", ""),
                "yes" if j.on_front else "no",
                str(j.run_dir),
                j.error or "",
            ]
        )
    return out.getvalue()


def markdown_text(summary: SweepSummary, plot: str | None = "pareto.png") -> str:
    jobs = summary.jobs
    ok = sum(j.ok for j in jobs)
    common = _common_overrides(jobs)
    lines = [
        f"# etbuild sweep: {summary.sweep_dir}",
        "",
        f"{len(jobs)} jobs: {ok} ok, {len(jobs) - ok} failed.",
    ]
    if common:
        lines.append("Every job: " + " ".join(f"`{o}`" for o in common) + ".")
    banks = summary.banks
    lines += [
        "",
        "Latency: the runner's median over `pipeline.verify.latency_iters` runs. Sizes in KiB: "
        "the runtime (core + kernels + registration) and the program (`model.pte`). Planned: "
        "the memory plan per bank. SQNR: against the fp32 model (quantized builds).",
        "",
        "| job | overrides | status | latency ms | runtime KiB | program KiB | "
        + "".join(f"planned {b} KiB | " for b in banks)
        + "SQNR dB | Pareto |",
        "|---|---|---|---|---|---|" + "---|" * len(banks) + "---|---|",
    ]
    for j in jobs:
        own = [o for o in j.overrides if o not in common]
        planned = j.metrics.get("planned_bytes") or {}
        cells = [
            j.label,
            " ".join(f"`{_md_escape(o)}`" for o in own) or "(none)",
            j.status,
            _latency_cell(j),
            _kib(j.metrics.get("runtime_bytes")),
            _kib(j.metrics.get("program_bytes")),
            *(_kib(planned.get(b)) for b in banks),
            _sqnr_cell(j),
            "**yes**" if j.on_front else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    axes = "latency vs size (program + runtime)" + (" vs SQNR" if summary.uses_accuracy else "")
    lines += ["", f"## Pareto front: {axes}", ""]
    front = summary.front
    if front:
        for j in sorted(front, key=lambda j: j.latency_ms):
            acc = f", SQNR {_sqnr_cell(j)} dB" if j.sqnr_db is not None else ""
            acc = acc or (", fp32" if summary.uses_accuracy else "")
            lines.append(
                f"- job {j.label} ({' '.join(j.overrides) or 'no overrides'}): "
                f"{_num(j.latency_ms)} ms, {_kib(j.size_bytes)} KiB{acc}"
            )
    else:
        lines.append("No job has a latency measured on this machine and both sizes.")
    left_out = [
        j for j in jobs if j.ok and (j.latency_ms is None or j.size_bytes is None or j.emulated)
    ]
    if left_out:
        lines += [
            "",
            "Not compared (not timed: a target that does not run here, or "
            "pipeline.verify.latency_iters=1; or timed under an emulator): "
            + ", ".join(f"job {j.label}" for j in left_out)
            + ".",
        ]
    if plot:
        lines += ["", f"![latency vs size]({plot})"]
    lines += search_lines(summary)
    if summary.failed:
        lines += ["", "## Failed jobs"]
        for j in summary.failed:
            lines += [
                "",
                f"### job {j.label}: {j.status}",
                "",
                f"- overrides: {' '.join(f'`{o}`' for o in j.overrides) or '(none)'}",
                f"- run directory: `{j.run_dir}`",
                "",
                "```",
                (j.error or "").rstrip(),
                "```",
            ]
    return "\n".join(lines) + "\n"


def plot_pareto(summary: SweepSummary) -> bytes:
    """pareto.png's bytes: latency (x) against size (y); the front ringed and labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [
        j for j in summary.jobs if j.ok and j.latency_ms is not None and j.size_bytes is not None
    ]
    fig, ax = plt.subplots(figsize=(7, 5), dpi=100)
    try:
        if not points:
            ax.text(
                0.5,
                0.5,
                "no job has a measured latency and both sizes",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            ax.set_axis_off()
        else:
            xs = [j.latency_ms for j in points]
            ys = [j.size_bytes / 1024 for j in points]
            sqnr = [j.sqnr_db for j in points]
            quantized = [j for j, s in zip(points, sqnr, strict=True) if s is not None]
            if quantized:
                sc = ax.scatter(
                    [j.latency_ms for j in quantized],
                    [j.size_bytes / 1024 for j in quantized],
                    c=[j.sqnr_db for j in quantized],
                    cmap="viridis",
                    s=50,
                    zorder=3,
                )
                fig.colorbar(sc, ax=ax, label="SQNR vs fp32 (dB)")
            rest = [j for j in points if j.sqnr_db is None]
            if rest:
                ax.scatter(
                    [j.latency_ms for j in rest],
                    [j.size_bytes / 1024 for j in rest],
                    marker="s",
                    color="tab:gray",
                    s=50,
                    zorder=3,
                    label="fp32" if any(not j.quantized for j in rest) else "no SQNR",
                )
            front = [j for j in points if j.on_front]
            if front:
                ax.scatter(
                    [j.latency_ms for j in front],
                    [j.size_bytes / 1024 for j in front],
                    s=180,
                    facecolors="none",
                    edgecolors="tab:red",
                    linewidths=1.5,
                    zorder=4,
                    label="Pareto front",
                )
            for j, x, y in zip(points, xs, ys, strict=True):
                tag = f" {j.label}" + (" (emulated)" if j.emulated else "")
                ax.annotate(tag, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
            ax.set_xlabel("latency, median (ms)")
            ax.set_ylabel("program + runtime (KiB)")
            ax.grid(True, alpha=0.3)
            if rest or front:
                ax.legend(loc="best", fontsize=8)
        ax.set_title(f"etbuild sweep: {len(summary.jobs)} jobs, {len(summary.front)} on the front")
        fig.tight_layout()
        out = io.BytesIO()
        fig.savefig(out, format="png")
        return out.getvalue()
    finally:
        plt.close(fig)


def write_results(summary: SweepSummary) -> list[Path]:
    """Write sweep.md, sweep.csv and pareto.png into the sweep directory; returns their paths."""
    from .runner import write_atomic

    d = summary.sweep_dir
    d.mkdir(parents=True, exist_ok=True)
    png = d / "pareto.png"
    write_atomic(png, plot_pareto(summary))
    write_atomic(d / "sweep.csv", csv_text(summary).encode())
    write_atomic(d / "sweep.md", markdown_text(summary).encode())
    return [d / "sweep.md", d / "sweep.csv", png]


# --- the Hydra callback -----------------------------------------------------------------


def _stamp(job_dir: Path) -> int | None:
    try:
        return (job_dir / ".hydra" / "overrides.yaml").stat().st_mtime_ns
    except OSError:
        return None


class SweepCallback(Callback):
    """Writes a multirun's results into its sweep directory, and exits 1 when a job failed.

    Job directories left in the sweep directory by an earlier multirun are told apart from
    this one's by the time stamp of ``.hydra/overrides.yaml``, which Hydra writes anew when a
    job starts."""

    def __init__(self) -> None:
        self._before: dict[Path, int | None] = {}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from .errors import EtbuildError
        from .search import check_directions

        try:
            check_directions(config)
        except EtbuildError as exc:
            print(f"etbuild: error: {exc}", file=sys.stderr)
            sys.exit(1)
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        if sweep_dir.is_dir():
            self._before = {d: _stamp(d) for d in job_dirs(sweep_dir)}

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        dirs = [
            d
            for d in (job_dirs(sweep_dir) if sweep_dir.is_dir() else [])
            if d not in self._before or _stamp(d) != self._before[d]
        ]
        if not dirs:
            print(
                f"etbuild: error: the sweep wrote no job directory under {sweep_dir}; a launcher "
                "that runs jobs elsewhere must share hydra.sweep.dir with this machine",
                file=sys.stderr,
            )
            sys.exit(1)
        summary = summarize(sweep_dir, dirs)
        try:
            written = write_results(summary)
        except OSError as exc:
            print(f"etbuild: error: cannot write the sweep results: {exc}", file=sys.stderr)
            sys.exit(1)
        jobs, failed = summary.jobs, summary.failed
        print(
            f"etbuild: sweep: {len(jobs)} jobs, {len(jobs) - len(failed)} ok, {len(failed)} "
            f"failed -> {written[0]} ({', '.join(p.name for p in written[1:])})"
        )
        if failed:
            print(f"etbuild: {len(failed)} sweep job(s) failed:", file=sys.stderr)
            for j in failed:
                first = (j.error or j.status).strip().splitlines()
                print(f"  {j.run_dir}: {first[0] if first else j.status}", file=sys.stderr)
            sys.exit(1)
