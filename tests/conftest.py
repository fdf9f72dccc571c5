"""Shared test helpers: config composition, in-process and CLI builds.

The tests run against the *installed* ``etbuild`` package (a non-editable install works the
same as a checkout). Test-only models live in ``tests/models_for_tests.py``; this directory is
put on ``sys.path`` (and on ``PYTHONPATH`` for CLI subprocesses) so a config can name them as
``model._target_=models_for_tests.<name>``. Test modules import the helpers below with
``from etbuild_test_support import ...``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from omegaconf import DictConfig

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

# Test modules import these helpers as ``etbuild_test_support``: pytest imports every
# ``conftest.py`` outside a package as the module ``conftest`` (tests/runtime has one too), so
# ``from conftest import ...`` would depend on collection order.
sys.modules["etbuild_test_support"] = sys.modules[__name__]

# Runtime builds go to a cache private to this test session (never the user's ~/.cache); CLI
# subprocesses and xdist's workers inherit it. Builds with the same selection share it within
# the session. The process that made it removes it at the end (about 100 MB a session).
_SESSION_CACHE = None
if not os.environ.get("ETBUILD_CACHE_DIR"):
    import tempfile

    _SESSION_CACHE = tempfile.mkdtemp(prefix="etbuild-test-cache-")
    os.environ["ETBUILD_CACHE_DIR"] = _SESSION_CACHE


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION_CACHE is not None:
        import shutil

        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


ARTIFACTS = (
    "model.pte",
    "manifest.json",
    "report.md",
    "memory_plan.json",
    "selected_operators.yaml",
    "reference.pt",
)
ZOO = (
    "mobilenet",
    "mobilenet_v3_small",
    "resnet18",
    "mlp",
    "transformer",
    # the MLPerf Tiny reference models
    "ds_cnn",
    "mobilenet_v1_vww",
    "resnet8",
    "fc_autoencoder",
)


@contextmanager
def hydra_context() -> Iterator[None]:
    """Hydra's compose API over the packaged conf/ tree (schemas registered first)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from etbuild.pipeline.config import register_configs
    from etbuild.pipeline.paths import CONF_DIR

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The composed manifest for ``overrides`` (as on the command line)."""
    from hydra import compose

    with hydra_context():
        return compose(config_name="config", overrides=list(overrides))


def custom_model_overrides(name: str, inputs: Sequence[tuple[str, Sequence[int]]]) -> list[str]:
    """Overrides that point ``model`` at ``models_for_tests.<name>`` with float inputs."""
    specs = ",".join(
        "{name:" + n + ",shape:[" + ",".join(str(s) for s in shape) + "]}" for n, shape in inputs
    )
    return [
        "model=mlp",
        f"model._target_=models_for_tests.{name}",
        f"model.name={name}",
        "model.args={}",
        "model.dynamic_dims=[]",
        f"model.inputs=[{specs}]",
    ]


def build_in_process(
    overrides: Sequence[str],
    run_dir: Path,
    stage_cache: bool = False,
    wheel: bool = False,
):
    """Compose ``overrides`` and build into ``run_dir`` exactly as the command does
    (``etbuild.pipeline.cli.build``); returns the runner's Context (artifacts in memory).

    The stage cache is off unless ``stage_cache``: tests read the in-memory artifacts of every
    stage, which a cache hit does not recreate. The host wheel (it compiles the Python module
    once more for every selection) is off unless ``wheel``; tests/e2e/test_build_stage.py
    checks it.

    The Context is captured by wrapping ``runner.run_stages``, which ``build`` looks up when
    it runs; a failing build raises as ``build`` does.
    """
    from etbuild.pipeline import cli, runner

    switches = [
        f"pipeline.cache={str(stage_cache).lower()}",
        f"build.wheel={str(wheel).lower()}",
    ]
    cfg = compose_config([*overrides, *switches])
    real = runner.run_stages
    captured = []

    def capture(*args, **kwargs):
        kwargs.setdefault("log", lambda _line: None)
        ctx = real(*args, **kwargs)
        captured.append(ctx)
        return ctx

    runner.run_stages = capture
    try:
        cli.build(cfg, run_dir)
    finally:
        runner.run_stages = real
    assert captured, "cli.build did not run the stages"
    return captured[0]


def stage_record(run_dir: Path, name: str) -> dict:
    """The manifest.json entry of stage ``name`` of a run."""
    import json

    manifest = json.loads((run_dir / "manifest.json").read_text())
    return next(s for s in manifest["stages"] if s["name"] == name)


def kernels_in_library(library: Path, nm: str = "nm") -> set[str]:
    """The op keys of ops_yaml whose kernel function ``library`` defines (by ``nm``)."""
    from etbuild.codegen.gen import load_entries
    from etbuild.pipeline.paths import OPS_YAML_DIR

    out = subprocess.run(
        [nm, "-C", "--defined-only", str(library)], check=True, capture_output=True, text=True
    ).stdout
    defined = {line.split(" ", 2)[2].split("(")[0] for line in out.splitlines() if " T " in line}
    return {e.schema.key for e in load_entries(OPS_YAML_DIR) if e.kernel_name in defined}


def build_cmake_app(app: Path, *cmake_args: str) -> subprocess.CompletedProcess:
    """Configure (must succeed) and build the CMake project in ``app`` into ``app/b``; returns
    the build's result."""
    import shutil

    cmake = shutil.which("cmake") or "cmake"
    subprocess.run(
        [cmake, "-S", str(app), "-B", str(app / "b"), "-G", "Ninja", *cmake_args],
        check=True,
        capture_output=True,
    )
    return subprocess.run([cmake, "--build", str(app / "b")], capture_output=True, text=True)


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.pop("HYDRA_FULL_ERROR", None)  # test what a user sees by default
    return env


def _sigint_default() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def interruptible_child(cmd: Sequence[str], **popen_kwargs) -> Iterator[subprocess.Popen]:
    """A child process that a test interrupts with SIGINT, its stdout and stderr piped as text.
    It starts with SIGINT at its default: a test session started as a background job inherits
    it ignored, and a child (Python among them) that starts with it ignored never sees Ctrl-C.
    A child still running when the test leaves (it ignored the signal, or an assertion
    failed) is killed rather than left looping for hours."""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_default,
        **popen_kwargs,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_cli(
    args: Sequence[str], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the ``etbuild`` console script (the installed one) with ``args`` in ``cwd``, in
    ``env`` (default: cli_env())."""
    exe = Path(sys.executable).parent / "etbuild"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "etbuild.pipeline.cli"]
    return subprocess.run(
        [*cmd, *args],
        cwd=cwd,
        env=cli_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# Runs programs in ExecuTorch's runtime, in a subprocess (a crash is reported per program
# instead of killing the test session). Each argument is RUN_DIR or RUN_DIR=CASES_FILE; the
# program's reference.pt inputs (and each case's) are run and compared with its outputs.
EXECUTORCH_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from executorch.runtime import Runtime
    rt = Runtime.get()
    def compare(outs, want):
        return [{
            "shape": list(o.shape), "want_shape": list(e.shape),
            "err": (o.float() - e.float()).abs().max().item(),
            "scale": e.float().abs().max().item(), "std": e.float().std().item(),
        } for o, e in zip(outs, want)]
    for arg in sys.argv[1:]:
        run_dir, _, cases_file = arg.partition("=")
        ref = torch.load(f"{run_dir}/reference.pt", weights_only=True)
        try:
            method = rt.load_program(f"{run_dir}/model.pte").load_method("forward")
            outs = method.execute(ref["inputs"])
            line = {"run_dir": run_dir, "outputs": compare(outs, ref["outputs"]),
                    "n": len(outs), "want_n": len(ref["outputs"]), "cases": []}
            if cases_file:
                cases = torch.load(cases_file, weights_only=True)
                for ins, want in zip(cases["inputs"], cases["outputs"]):
                    line["cases"].append(compare(method.execute(ins), want))
        except Exception as exc:
            line = {"run_dir": run_dir, "error": repr(exc)}
        print("ETRESULT " + json.dumps(line), flush=True)
    """
)


def run_in_executorch(run_dirs: Sequence[str], cases: dict[str, Path] | None = None) -> dict:
    """{run_dir: result} of running each run directory's model.pte in ExecuTorch's runtime:
    per output its shape, max error, max |expected| and std (or ``error``)."""
    if importlib.util.find_spec("executorch") is None:
        pytest.skip("executorch is not importable; pip install executorch==1.5.1")
    args = [f"{d}={cases[d]}" if cases and d in cases else d for d in run_dirs]
    proc = subprocess.run(
        [sys.executable, "-c", EXECUTORCH_SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("ETRESULT "):
            r = json.loads(line.removeprefix("ETRESULT "))
            results[r["run_dir"]] = r
    failed = {"error": f"runtime exited {proc.returncode}: {proc.stderr[-2000:]}"}
    return {d: results.get(d, failed) for d in run_dirs}


@pytest.fixture(scope="session")
def zoo_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every zoo model built once per session, in-process, with its default config.

    Built lazily: ``zoo_build(name)`` builds on first use and reuses the run directory after.
    """
    return {}


@pytest.fixture(scope="session")
def zoo_build(zoo_builds: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """``zoo_build(name) -> run_dir``: the session's one build of a zoo model."""

    def get(name: str) -> Path:
        if name not in zoo_builds:
            run_dir = tmp_path_factory.mktemp(f"zoo_{name}")
            build_in_process([f"model={name}"], run_dir)
            zoo_builds[name] = run_dir
        return zoo_builds[name]

    return get
