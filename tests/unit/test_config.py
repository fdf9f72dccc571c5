"""Composition and validation of the config tree (conf/ + the structured-config schemas)."""

from __future__ import annotations

from pathlib import Path

import pytest
from etbuild_test_support import ZOO, compose_config, interruptible_child, run_cli
from omegaconf import OmegaConf

from etbuild.pipeline.cli import build, check_supported
from etbuild.pipeline.config import (
    EtbuildConfig,
    MemoryConfig,
    ModelConfig,
    Planner,
    QuantScheme,
    StageName,
    TargetKind,
    validate,
)
from etbuild.pipeline.errors import EtbuildError


def _message(exc: BaseException) -> str:
    """The text a user sees: the exception and its causes (Hydra prints the whole chain)."""
    parts = []
    while exc is not None:
        parts.append(str(exc))
        exc = exc.__cause__
    return "\n".join(parts)


def _compose_error(overrides: list[str]) -> str:
    with pytest.raises(Exception) as info:
        compose_config(overrides)
    assert not isinstance(info.value, (AssertionError, ImportError)), info.value
    return _message(info.value)


# -- what composes ---------------------------------------------------------------------


def test_defaults_compose() -> None:
    cfg = compose_config()
    assert OmegaConf.get_type(cfg) is EtbuildConfig
    assert cfg.model.name == "mobilenet"
    assert cfg.model._target_ == "etbuild.pipeline.zoo.mobilenet_v2"
    assert [list(i.shape) for i in cfg.model.inputs] == [[1, 3, 224, 224]]
    assert cfg.model.checkpoint is None
    assert cfg.quant.scheme == QuantScheme.none
    assert cfg.partitioner.name == "none"
    assert cfg.target.kind == TargetKind.host and cfg.target.name == "host"
    assert cfg.memory.planner == Planner.hill_climb
    assert len(cfg.memory.banks) == 1 and cfg.memory.banks[0].size_bytes is None
    assert cfg.pipeline.stop_after is None
    # Defaults are a valid build request.
    check_supported(cfg)


@pytest.mark.parametrize("model", ZOO)
def test_every_model_option_composes(model: str) -> None:
    cfg = compose_config([f"model={model}"])
    assert cfg.model.name == model
    assert OmegaConf.get_type(cfg.model) is ModelConfig
    assert cfg.model._target_.startswith("etbuild.pipeline.zoo.")
    assert len(cfg.model.inputs) >= 1
    for spec in cfg.model.inputs:
        assert all(isinstance(s, int) and s > 0 for s in spec.shape)
    check_supported(cfg)


def test_model_options_include_the_zoo() -> None:
    from etbuild.pipeline.paths import CONF_DIR

    assert set(ZOO) <= {p.stem for p in (Path(CONF_DIR) / "model").glob("*.yaml")}


def test_appended_groups_compose_and_equal_the_defaults() -> None:
    plain = compose_config(["model=mlp"])
    full = compose_config(
        ["model=mlp", "+target=host", "+quant=none", "+memory=flat", "+partitioner=none"]
    )
    assert OmegaConf.to_container(full) == OmegaConf.to_container(plain)
    check_supported(full)


def test_overrides_are_typed() -> None:
    cfg = compose_config(
        [
            "model=mlp",
            "memory.alignment=64",
            "memory.planner=naive",
            "memory.banks.0.size_bytes=4096",
            "pipeline.stop_after=lower",
            "model.checkpoint=/some/file.pt",
        ]
    )
    assert cfg.memory.alignment == 64
    assert cfg.memory.planner == Planner.naive
    assert cfg.memory.banks[0].size_bytes == 4096
    assert cfg.pipeline.stop_after == StageName.lower
    assert cfg.model.checkpoint == "/some/file.pt"
    assert OmegaConf.get_type(cfg.memory) is MemoryConfig


# -- what fails, and what it says ----------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.chekpoint=x", "chekpoint"),
        ("memory.aligment=8", "aligment"),
        ("quant.shceme=none", "shceme"),
        ("pipeline.stop_afer=lower", "stop_afer"),
    ],
)
def test_typo_key_fails_naming_the_key(override: str, key: str) -> None:
    msg = _compose_error(["model=mlp", override])
    assert key in msg


@pytest.mark.parametrize(
    ("override", "key"),
    [("+model.chekpoint=x", "chekpoint"), ("+memory.aligment=8", "aligment")],
)
def test_appended_typo_key_fails_before_any_work(override: str, key: str, tmp_path: Path) -> None:
    """``+key=value`` bypasses Hydra's struct check, so the product must validate itself.

    Either composition or ``build`` (before the first stage produces anything) must reject it.
    """
    overrides = ["model=mlp", override, "pipeline.stop_after=model"]
    try:
        cfg = compose_config(overrides)
    except Exception as exc:  # rejected at compose time: fine
        assert key in _message(exc)
        return
    with pytest.raises(EtbuildError) as info:
        build(cfg, tmp_path / "run")
    assert key in str(info.value)


def test_unknown_option_names_the_available_options() -> None:
    msg = _compose_error(["model=mobilnet"])
    assert "mobilnet" in msg
    for option in ZOO:
        assert option in msg


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("memory.planner=best", "memory.planner", ["greedy_by_size", "naive"]),
        ("quant.scheme=int3", "quant.scheme", [s.value for s in QuantScheme]),
        ("target.kind=windows", "target.kind", [k.value for k in TargetKind]),
        ("pipeline.stop_after=lowr", "pipeline.stop_after", [s.value for s in StageName]),
        ("model.inputs.0.dtype=float99", "dtype", ["float32", "int64"]),
    ],
)
def test_wrong_enum_value_names_the_allowed_values(
    override: str, key: str, allowed: list[str]
) -> None:
    msg = _compose_error(["model=mlp", override])
    assert key in msg
    for value in allowed:
        assert value in msg


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("memory.alignment=abc", "memory.alignment"),
        ("memory.in_place=maybe", "memory.in_place"),
        ("memory.banks.0.size_bytes=big", "size_bytes"),
        ("model.seed=1.5", "model.seed"),
    ],
)
def test_wrong_type_fails_naming_the_key(override: str, key: str) -> None:
    msg = _compose_error(["model=mlp", override])
    assert key in msg
    assert override.split("=", 1)[1] in msg


def test_bad_alignment_value_is_rejected(tmp_path: Path) -> None:
    cfg = compose_config(["model=mlp", "memory.alignment=24", "pipeline.stop_after=plan"])
    with pytest.raises(EtbuildError, match=r"memory\.alignment=24.*power of two"):
        build(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "model.pte").exists()


def test_a_run_marks_its_directory_before_the_first_stage(tmp_path: Path) -> None:
    """An old manifest saying "ok" is replaced before any stage runs, and a run stopped by
    Ctrl-C (KeyboardInterrupt) records "interrupted"."""
    import json

    from etbuild.pipeline.runner import Stage, run_stages

    (tmp_path / "manifest.json").write_text(json.dumps({"status": "ok"}))
    seen = []

    def first(ctx) -> None:
        seen.append(json.loads((tmp_path / "manifest.json").read_text())["status"])
        raise KeyboardInterrupt

    cfg = compose_config(["model=mlp"])
    with pytest.raises(KeyboardInterrupt):
        run_stages([Stage("first", first)], cfg, tmp_path, log=lambda _: None)
    assert seen == ["running"]
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert (
        m["status"] == "interrupted" and m["stages"][0]["summary"]["failed"] == "KeyboardInterrupt"
    )


def test_ctrl_c_stops_etbuild_with_one_line_and_exit_130(tmp_path: Path) -> None:
    import json
    import os
    import shutil
    import signal
    import sys

    etbuild = shutil.which("etbuild") or str(Path(sys.executable).parent / "etbuild")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # etbuild flushes
    # Uncached, so that the stages after the first take long enough for the signal to land
    # in one (from a warm cache all thirteen took 0.15 s, and the signal came after "done").
    args = [etbuild, "model=mlp", "pipeline.cache=false", f"hydra.run.dir={tmp_path}"]
    with interruptible_child(args, env=env) as proc:
        line = proc.stdout.readline()
        while line and not line.startswith("[1/"):  # the first stage has finished
            line = proc.stdout.readline()
        assert line.startswith("[1/"), line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert f"etbuild: interrupted: {tmp_path}" in err and "Traceback" not in err, err
    assert json.loads((tmp_path / "manifest.json").read_text())["status"] == "interrupted"


def test_bad_stop_after_for_run_stages(tmp_path: Path) -> None:
    from etbuild.pipeline.runner import run_stages
    from etbuild.pipeline.stages import STAGES

    cfg = compose_config(["model=mlp"])
    with pytest.raises(EtbuildError, match="not a stage; stages are: model, export, "):
        run_stages(STAGES, cfg, tmp_path, stop_after="lowr")


def test_stage_enum_matches_the_stage_list() -> None:
    from etbuild.pipeline.stages import STAGES

    assert [s.name for s in STAGES] == [s.value for s in StageName]


# -- options that compose but are not built yet (later issues lift these) ------------------


@pytest.mark.parametrize("scheme", ["none", "ptq", "qat", "dynamic"])
def test_quant_options_compose_and_are_supported(scheme: str) -> None:
    cfg = compose_config(["model=mlp", f"+quant={scheme}"])
    assert cfg.quant.scheme == QuantScheme(scheme)
    check_supported(cfg)  # raises on anything this version cannot build


def test_quant_options_are_validated() -> None:
    with pytest.raises(Exception, match="per_row") as info:
        compose_config(["+quant=ptq", "quant.weights=per_row"])
    assert "per_channel" in _message(info.value) and "per_tensor" in _message(info.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+target=android", r"Android NDK.*target\.ndk.*ANDROID_NDK_HOME.*ANDROID_NDK_ROOT"),
        (
            "+target=cortex_m target.compiler_prefix=no-such-arm-",
            r"no-such-arm-gcc is not on PATH.*apt-get install gcc-arm-none-eabi",
        ),
        ("partitioner.name=xnnpack", r"partitioner 'xnnpack' has no _target_"),
    ],
)
def test_unsupported_options_are_rejected(
    override: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    monkeypatch.delenv("ANDROID_NDK_ROOT", raising=False)
    cfg = compose_config(override.split())
    with pytest.raises(EtbuildError, match=expected):
        check_supported(cfg)


def test_unsupported_option_fails_before_any_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no NDK, an android build stops before export (no stage runs, nothing written)."""
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    monkeypatch.delenv("ANDROID_NDK_ROOT", raising=False)
    cfg = compose_config(["model=mlp", "+target=android"])
    with pytest.raises(EtbuildError, match="target.ndk"):
        build(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


# -- target.march: the kernels' -march (CMake's ETB_ARCH) -------------------------------------


@pytest.mark.parametrize(
    ("overrides", "march"),
    [
        ([], "native"),  # no target group: the host, compiled for this machine
        (["+target=host"], "native"),
        (["+target=linux_aarch64"], None),  # cross targets: the toolchain's default
        (["+target=android"], None),
        (["+target=cortex_m"], None),
        (["target.march=x86-64-v3"], "x86-64-v3"),
        (["target.march=null"], None),
    ],
)
def test_target_march_defaults(overrides: list[str], march: str | None) -> None:
    cfg = validate(compose_config(["model=mlp", *overrides]))
    assert cfg.target.march == march


@pytest.mark.parametrize(
    ("march", "define"),
    [("native", "-DETB_ARCH=native"), ("x86-64-v3", "-DETB_ARCH=x86-64-v3"),
     ("null", "-DETB_ARCH="), ("''", "-DETB_ARCH="),
     ("armv8.2-a+fp16", "-DETB_ARCH=armv8.2-a+fp16")],
)  # fmt: skip
def test_target_march_reaches_etb_arch_and_the_build_key(
    march: str, define: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from etbuild.pipeline.stages import build as build_stage
    from etbuild.pipeline.stages.build import build_inputs, cmake_args
    from etbuild.pipeline.toolchain import resolve

    # The key's flags and toolchain part only (the source trees may change under a test run).
    monkeypatch.setattr(build_stage, "tree_digest", lambda *args: None)

    cfg = validate(compose_config(["model=mlp", f"target.march={march}"]))
    tc = resolve(cfg.target)
    assert [a for a in cmake_args(cfg, tc) if a.startswith("-DETB_ARCH")] == [define]
    assert not any("ETB_NATIVE_ARCH" in a for a in cmake_args(cfg, tc))
    native = validate(compose_config(["model=mlp"]))
    same = build_inputs(native, resolve(native.target)).hexdigest()
    assert (build_inputs(cfg, tc).hexdigest() == same) == (march == "native")
    # Only a native build depends on this CPU's features (an -march level is portable).
    assert ("flags" in tc.identity[-1]) == (march == "native" and Path("/proc/cpuinfo").exists())


@pytest.mark.parametrize(
    "value",
    ["x86 64", "'x86-64 -O0'", "'x86-64;rm -rf /'", "'$(id)'", "'a`b`'", "'v3|cat'",
     "'-march=native'", "'-O0'", "'x86-64&'", "'>out'"],
)  # fmt: skip
def test_bad_target_march_fails_at_compose_time_naming_the_key(value: str) -> None:
    """Quoted, Hydra takes any string; the schema's pattern (checked by validate, the first
    thing a build does) takes one -march word."""
    cfg = compose_config(["model=mlp", f"target.march={value}"])
    with pytest.raises(EtbuildError, match=r"target\.march=.*an -march value") as info:
        validate(cfg)
    assert "null" in str(info.value)  # says how to get the toolchain's default
    with pytest.raises(EtbuildError, match=r"target\.march="):
        check_supported(cfg)  # and the toolchain never puts it on a command line


@pytest.mark.parametrize("target", ["linux_aarch64", "android", "cortex_m"])
def test_native_march_on_a_cross_target_is_rejected(target: str) -> None:
    cfg = validate(compose_config(["model=mlp", f"+target={target}", "target.march=native"]))
    with pytest.raises(EtbuildError, match=r"target\.march=native.*target\.march=null"):
        check_supported(cfg)


def test_cortex_m_names_its_core_with_cpu_not_march() -> None:
    cfg = validate(compose_config(["model=mlp", "+target=cortex_m", "target.march=armv7e-m"]))
    with pytest.raises(EtbuildError, match=r"target\.march='armv7e-m'.*target\.cpu"):
        check_supported(cfg)


# -- target.threads: the threads the runtime splits its kernels over ---------------------------


@pytest.mark.parametrize("threads", [1, 2, 64])
def test_target_threads_reaches_the_toolchain(threads: int) -> None:
    from etbuild.pipeline.toolchain import resolve

    cfg = validate(compose_config(["model=mlp", f"target.threads={threads}"]))
    assert resolve(cfg.target).threads == threads


@pytest.mark.parametrize("threads", [0, -1, 65])
def test_target_threads_out_of_range_is_rejected_before_any_work(threads: int) -> None:
    cfg = validate(compose_config(["model=mlp", f"target.threads={threads}"]))
    msg = rf"target\.threads={threads} is not valid: it must be 1 to 64"
    with pytest.raises(EtbuildError, match=msg):
        check_supported(cfg)


def test_cortex_m_has_no_threads() -> None:
    cfg = validate(compose_config(["model=mlp", "+target=cortex_m", "target.threads=2"]))
    with pytest.raises(EtbuildError, match=r"target\.threads=2: a cortex_m build is bare metal"):
        check_supported(cfg)


# -- through the real command line -----------------------------------------------------------


def _assert_clean_failure(proc, *needles: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    for needle in needles:
        assert needle in out, out
    return out


def test_cli_typo_key(tmp_path: Path) -> None:
    proc = run_cli(["model=mlp", "memory.aligment=8", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    _assert_clean_failure(proc, "memory.aligment")
    assert not (tmp_path / "run" / "model.pte").exists()


def test_cli_unknown_option_and_enum(tmp_path: Path) -> None:
    proc = run_cli(["model=mobilnet", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    _assert_clean_failure(proc, "mobilnet", "mobilenet_v3_small", "transformer")
    proc = run_cli(["model=mlp", "memory.planner=best", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    _assert_clean_failure(proc, "memory.planner", "greedy_by_size", "naive")


def test_cli_missing_target_toolchain(tmp_path: Path) -> None:
    proc = run_cli(
        ["model=mlp", "+target=cortex_m", "target.compiler_prefix=no-such-arm-",
         f"hydra.run.dir={tmp_path}/run"],
        tmp_path,
    )  # fmt: skip
    out = _assert_clean_failure(proc, "no-such-arm-gcc", "apt-get install gcc-arm-none-eabi")
    assert "error" in proc.stderr, out
    assert not (tmp_path / "run" / "model.pte").exists()


def test_cli_bad_target_march(tmp_path: Path) -> None:
    proc = run_cli(["model=mlp", "target.march=x86 64", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    _assert_clean_failure(proc, "target.march='x86 64'", "-march value")
    assert not (tmp_path / "run" / "model.pte").exists()


def test_cli_target_threads_must_be_a_number_in_range(tmp_path: Path) -> None:
    proc = run_cli(["model=mlp", "target.threads=four", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    _assert_clean_failure(proc, "target.threads", "four")
    proc = run_cli(["model=mlp", "target.threads=0", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    _assert_clean_failure(proc, "target.threads=0 is not valid: it must be 1 to 64")
    assert not (tmp_path / "run" / "model.pte").exists()


def test_cli_appended_typo_key_fails(tmp_path: Path) -> None:
    proc = run_cli(
        ["model=mlp", "+model.chekpoint=x", "pipeline.stop_after=model",
         f"hydra.run.dir={tmp_path}/run"],
        tmp_path,
    )  # fmt: skip
    _assert_clean_failure(proc, "chekpoint")


@pytest.mark.parametrize("preset", ["flat", "stm32h7", "mcu_psram", "mps2_an386"])
def test_memory_presets_compose_and_validate(preset: str) -> None:
    cfg = validate(compose_config(["model=mlp", f"+memory={preset}"]))
    assert cfg.memory.banks[0].size_bytes is None or cfg.memory.banks[0].size_bytes > 0
    assert any("activations" in [h.value for h in b.holds] for b in cfg.memory.banks)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["+memory=stm32h7", "memory.banks.1.name=dtcm"],
            "memory.banks: two banks are named 'dtcm'; give each bank its own name",
        ),
        (
            ["+memory=stm32h7", "memory.banks.1.section=.dtcm_bss"],
            "memory.banks: two banks share linker section '.dtcm_bss'; give each its own",
        ),
        (
            ["+memory=stm32h7", "memory.banks.0.holds=[scratch]", "memory.banks.1.holds=[scratch]"],
            "memory.banks: no bank holds activations; add 'activations' to the holds of a RAM bank",
        ),
        (
            ["memory.scratch_bytes=4096", "memory.banks.0.holds=[activations]"],
            "memory.scratch_bytes=4096 needs a bank that holds scratch",
        ),
        (
            ["memory.constants=copy"],
            "memory.constants=copy needs a bank that holds constants (where the weights live, "
            "such as flash) to copy them from; add one, or set memory.constants=in_place",
        ),
        (
            ["+memory=stm32h7", "memory.constants=copy", "memory.banks.2.read_cost=0.5"],
            "memory.constants=copy: no bank that holds activations reads cheaper than the "
            "constants bank 'flash' (read_cost 0.5), so a copy would gain nothing",
        ),
        (
            ["+memory=stm32h7", "memory.banks.0.read_cost=0"],
            "memory.banks[0].read_cost=0.0 is not valid: it must be more than 0",
        ),
        (
            ["+memory=stm32h7", "memory.banks.0.alignment=24"],
            "memory.banks[0].alignment=24 is not valid: it must be a power of two",
        ),
        (
            ["+memory=stm32h7", "memory.banks.0.section=dtcm"],
            "memory.banks[0].section='dtcm' is not valid: it must be a linker section name",
        ),
        (
            ["memory.banks.0.name=my-bank"],
            "memory.banks[0].name='my-bank' is not valid: it must be a C identifier",
        ),
    ],
)
def test_bad_memory_banks_fail_at_compose_time(overrides: list[str], message: str) -> None:
    cfg = compose_config(["model=mlp", *overrides])
    with pytest.raises(EtbuildError) as info:
        validate(cfg)
    assert message in str(info.value)


def test_bad_bank_holds_value_names_the_choices() -> None:
    msg = _compose_error(["model=mlp", "memory.banks.0.holds=[weights]"])
    for value in ("activations", "scratch", "constants"):
        assert value in msg
