"""Structured-config schemas for every config group, registered in Hydra's ConfigStore.

Every group is typed, so a typo'd key, a wrong type or an unknown enum value fails when the
config is composed, with OmegaConf's message naming the full key and the allowed values.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from .errors import EtbuildError


def bounded(
    default: Any = MISSING,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    power_of_two: bool = False,
    each: bool = False,
) -> Any:
    """A numeric setting whose range validate() checks (``each``: every item of a list), so a
    bad value fails when the config is composed, naming the key, not stages later."""
    meta = {"ge": ge, "gt": gt, "le": le, "power_of_two": power_of_two, "each": each}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"range": meta})
    return field(default=default, metadata={"range": meta})


def _range_expectation(meta: dict) -> str:
    parts = []
    if meta["power_of_two"]:
        parts.append("a power of two (1, 2, 4, 8, ...)")
    if meta["ge"] is not None and meta["le"] is not None:
        parts.append(f"from {meta['ge']:g} to {meta['le']:g}")
    elif meta["ge"] is not None:
        parts.append(f"{meta['ge']:g} or more")
    elif meta["le"] is not None:
        parts.append(f"{meta['le']:g} or less")
    if meta["gt"] is not None:
        parts.append(f"more than {meta['gt']:g}")
    text = " and ".join(parts)
    return f"a list of numbers each {text}" if meta["each"] else text


def _in_range(value: Any, meta: dict) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True  # the schema's types are OmegaConf's to check
    if meta["power_of_two"] and (value < 1 or int(value) != value or int(value) & int(value - 1)):
        return False
    if meta["ge"] is not None and value < meta["ge"]:
        return False
    if meta["le"] is not None and value > meta["le"]:
        return False
    return meta["gt"] is None or value > meta["gt"]


class DType(Enum):
    """Element types an example input may have (values are torch dtype names)."""

    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    int64 = "int64"
    int32 = "int32"
    int8 = "int8"
    uint8 = "uint8"
    bool = "bool"


@dataclass
class InputSpec:
    """One example input: shape, dtype and value range.

    Floating inputs are standard normal unless ``low``/``high`` are given (then uniform);
    integer inputs are drawn uniformly from ``[low, high)`` and need both bounds.
    """

    name: str = MISSING
    shape: list[int] = bounded(ge=1, each=True)
    dtype: DType = DType.float32
    low: float | None = None
    high: float | None = None


@dataclass
class DynamicDim:
    """A dimension of an input that may vary at run time, between ``min`` and ``max``."""

    name: str = MISSING
    input: str = MISSING
    dim: int = MISSING
    min: int = bounded(1, ge=0)
    max: int = bounded(ge=1)


@dataclass
class ModelConfig:
    """The model: any importable ``_target_`` that returns an ``nn.Module``.

    ``args`` are passed to ``_target_`` as keyword arguments. Weights are seeded random unless
    ``checkpoint`` names a state_dict file.
    """

    _target_: str = MISSING
    name: str = MISSING
    args: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    seed: int = bounded(0, ge=0)
    inputs: list[InputSpec] = MISSING
    dynamic_dims: list[DynamicDim] = field(default_factory=list)
    # Random batches used to re-estimate batch-norm statistics of seeded weights.
    bn_calibration_batches: int = bounded(4, ge=0)
    bn_calibration_batch_size: int = bounded(8, ge=1)


class QuantScheme(Enum):
    none = "none"
    ptq = "ptq"
    qat = "qat"
    dynamic = "dynamic"


class WeightGranularity(Enum):
    per_channel = "per_channel"
    per_tensor = "per_tensor"


class ActivationScheme(Enum):
    affine = "affine"
    symmetric = "symmetric"


class ObserverKind(Enum):
    minmax = "minmax"
    moving_average_minmax = "moving_average_minmax"
    histogram = "histogram"


@dataclass
class CalibrationConfig:
    """Calibration data for static quantization.

    By default ``num_batches`` batches are drawn from the model's example-input spec. Or
    ``folder``: a folder of ``*.pt`` files, each a tensor or a list/tuple of input tensors.
    Or ``_target_``: a callable (given ``num_batches`` and ``inputs``, the input specs) that
    returns an iterable of input tuples.
    """

    _target_: str | None = None
    folder: str | None = None
    num_batches: int = bounded(8, ge=1)


@dataclass
class KeepFp32Config:
    """What stays in fp32: module-name patterns (fnmatch, e.g. ``features.0.*``) and op types
    (``conv2d``, ``linear``, ``add``, ``mean``, ``max_pool2d``, ``adaptive_avg_pool2d``,
    ``avg_pool2d``, ``amax``, ...: pipeline/quant/quantizer.py's OP_TYPES)."""

    modules: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)


@dataclass
class QatConfig:
    """Quantization-aware training for ``steps`` steps over the calibration batches.

    ``train_step`` is instantiated once (``_target_`` plus its arguments) and then called as
    ``step(model, batch, teacher)`` each step, where ``teacher`` is the fp32 model; it computes
    the loss and updates the weights. The default distills the fp32 model's outputs with SGD.
    """

    train_step: dict[str, Any] = field(
        default_factory=lambda: {"_target_": "etbuild.pipeline.quant.qat.DistillStep", "lr": 1e-3}
    )
    steps: int = bounded(20, ge=0)


@dataclass
class QuantConfig:
    """Quantization. Absent means fp32."""

    scheme: QuantScheme = QuantScheme.none
    weights: WeightGranularity = WeightGranularity.per_channel
    activations: ActivationScheme = ActivationScheme.affine
    observer: ObserverKind = ObserverKind.minmax
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    keep_fp32: KeepFp32Config = field(default_factory=KeepFp32Config)
    qat: QatConfig = field(default_factory=QatConfig)
    # Fail the build when the program's SQNR against fp32 eager falls below this (dB).
    min_sqnr_db: float | None = None


@dataclass
class PartitionerConfig:
    """Delegate partitioner. Absent means no delegate: every op runs on portable kernels.

    ``_target_`` is a class or function returning a backend (pipeline/partition.py
    ``Backend``), called with ``args``. The filters narrow what the backend takes: ``ops``
    (op kinds such as ``convolution``, ``add``; empty: all it supports), module-name patterns
    (fnmatch, on the innermost module's path), ``dtypes`` (``float32``, ``int8``, ...: every
    tensor a node reads or writes) and the smallest partition worth a delegate call.
    """

    name: str = "none"
    _target_: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    ops: list[str] = field(default_factory=list)
    include_modules: list[str] = field(default_factory=list)
    exclude_modules: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    min_partition_size: int = bounded(1, ge=1)


class TargetKind(Enum):
    host = "host"
    linux_aarch64 = "linux_aarch64"
    android = "android"
    cortex_m = "cortex_m"


class FloatAbi(Enum):
    """cortex_m: ``-mfloat-abi`` (``hard``: float arguments in FPU registers)."""

    soft = "soft"
    softfp = "softfp"
    hard = "hard"


# target.march reaches the compiler's command line (-march=<value>): one word that starts with
# a letter or digit, no spaces and no shell or CMake metacharacters ("" is the same as null).
MARCH_PATTERN = r"([A-Za-z0-9][A-Za-z0-9._+-]*)?"
MARCH_EXPECTED = (
    "an -march value (a letter or digit, then letters, digits and . _ + -; e.g. native, "
    "x86-64-v3, armv8.2-a), or null for the toolchain's default"
)


@dataclass
class TargetConfig:
    """The device toolchain. Absent means the build machine itself.

    ``compiler_prefix`` names a GNU cross toolchain (``aarch64-linux-gnu-`` finds
    ``aarch64-linux-gnu-g++``, ``-strip``, ``-nm``); ``toolchain_file`` is a CMake toolchain
    file used instead. android: ``ndk`` (else ``ANDROID_NDK_HOME``, else ``ANDROID_NDK_ROOT``),
    ``abi`` and ``api_level``. ``qemu`` runs a linux_aarch64 runner here with
    ``qemu-aarch64 -L <qemu_sysroot>``. cortex_m (bare metal, ``arm-none-eabi-``): ``cpu``
    (``-mcpu``), ``fpu`` (``-mfpu``; null for none) and ``float_abi`` (``-mfloat-abi``);
    ``board`` the board a firmware is built for, which verify runs under ``qemu``
    (``qemu-system-arm``).

    ``march`` is the instruction-set level the kernels are compiled for (their ``-march``, the
    runtime's ``ETB_ARCH``), which picks their SIMD path: ``native`` (the host's default: this
    machine's CPU), null or ``""`` (the toolchain's default, no ``-march``: the cross targets'
    default), or any ``-march`` value: ``x86-64`` (SSE2), ``x86-64-v2``, ``x86-64-v3`` (AVX2 +
    FMA: to ship to other AVX2 machines), ``x86-64-v4`` (AVX-512), ``armv8.2-a``.

    ``xnnpack_root``: a tree with XNNPACK's headers and libraries for this target
    (``+partitioner=xnnpack``; absent: the system's, for the host).

    ``threads`` is how many threads the runtime splits its kernels over on the device (the
    calling thread included; 1 to 64): the runner's ``--threads``, the Python module's
    ``load(path, threads=N)``. Verify runs the program at this count and the report records
    it. cortex_m has no threads (1).
    """

    name: str = "host"
    kind: TargetKind = TargetKind.host
    compiler_prefix: str | None = None
    toolchain_file: str | None = None
    ndk: str | None = None
    abi: str = "arm64-v8a"
    api_level: int = bounded(28, ge=1)
    qemu: str = "qemu-aarch64"
    qemu_sysroot: str = "/usr/aarch64-linux-gnu"
    cpu: str = "cortex-m4"
    fpu: str | None = "fpv4-sp-d16"
    float_abi: FloatAbi = FloatAbi.hard
    march: str | None = field(
        default="native", metadata={"pattern": MARCH_PATTERN, "expected": MARCH_EXPECTED}
    )
    threads: int = 1
    xnnpack_root: str | None = None
    # cortex_m: the board the firmware is built for and verify runs it on (a folder of
    # runtime_src/firmware/boards/, e.g. mps2_an386); null: the libraries only, no firmware.
    board: str | None = field(
        default=None,
        metadata={"pattern": r"[A-Za-z_][A-Za-z0-9_]*", "expected": "a board name (mps2_an386)"},
    )


class Planner(Enum):
    """How the planner places storages (one storage: a tensor, its views and in-place reuses).

    The greedy planners take storages in an order (largest first; most lifetime overlaps
    first) and give each the cheapest bank where it fits, at the lowest free offset;
    ``hill_climb`` refines the better greedy order by swapping storages while the cost falls;
    ``naive`` gives every storage its own bytes (the no-reuse baseline)."""

    greedy_by_size = "greedy_by_size"
    greedy_by_conflicts = "greedy_by_conflicts"
    hill_climb = "hill_climb"
    naive = "naive"


class Schedule(Enum):
    """The instruction order: the exported one, or reordered to lower the peak memory."""

    program = "program"
    min_peak = "min_peak"


class BankContent(Enum):
    """What a bank may hold: planned activations, the kernels' scratch memory, constants
    (a constants bank, such as flash, holds the program and its weights in place)."""

    activations = "activations"
    scratch = "scratch"
    constants = "constants"


class ConstantPlacement(Enum):
    """Where the program's constants are read from when it runs."""

    in_place = "in_place"  # from the program's data (flash, execute-in-place)
    # Copied at load into banks that hold activations and read cheaper than the constants
    # bank, while they have room, hottest bytes first (the program keeps them as planned
    # tensors with initial data: ExecuTorch's mutable data segments).
    copy = "copy"


IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
SECTION = r"\.[A-Za-z0-9_.]+"


@dataclass
class BankConfig:
    """One memory bank of the target. ``size_bytes`` caps what it holds (null: unbounded);
    ``read_cost``/``write_cost`` are relative cycles per byte, which the planner minimises;
    ``alignment`` (null: memory.alignment) aligns every tensor in it; ``section`` is the
    linker section a firmware places it in (null: the default .bss) and ``region`` the linker
    script's MEMORY region that section goes to."""

    name: str = field(
        default="sram", metadata={"pattern": IDENTIFIER, "expected": "a C identifier"}
    )
    size_bytes: int | None = bounded(None, gt=0)
    read_cost: float = bounded(1.0, gt=0)
    write_cost: float = bounded(1.0, gt=0)
    alignment: int | None = bounded(None, power_of_two=True)
    holds: list[BankContent] = field(
        default_factory=lambda: [BankContent.activations, BankContent.scratch]
    )
    section: str | None = field(
        default=None,
        metadata={"pattern": SECTION, "expected": "a linker section name such as .dtcm_bss"},
    )
    # The linker script's MEMORY region the section goes to (null: the section is placed by
    # the application's own linker script).
    region: str | None = field(
        default=None, metadata={"pattern": IDENTIFIER, "expected": "a linker MEMORY region name"}
    )


@dataclass
class MemoryConfig:
    """The memory hierarchy: the banks of the target, cheapest placement first.

    Absent: one unbounded bank. ``scratch_bytes`` reserves the kernels' scratch memory in a
    bank that holds scratch (null: the application provides it at run time)."""

    planner: Planner = Planner.hill_climb
    schedule: Schedule = Schedule.program
    alignment: int = bounded(16, power_of_two=True)
    # Let elementwise ops write their output over an input that dies at that op.
    in_place: bool = True
    # Let the producers of a concatenation's inputs write into its output (no copy).
    concat_in_place: bool = True
    scratch_bytes: int | None = bounded(None, gt=0)
    constants: ConstantPlacement = ConstantPlacement.in_place
    banks: list[BankConfig] = field(default_factory=lambda: [BankConfig()])


class StageName(Enum):
    model = "model"
    export = "export"
    quantize = "quantize"
    lower = "lower"
    partition = "partition"
    out_variant = "out_variant"
    plan = "plan"
    emit = "emit"
    reference = "reference"
    select = "select"
    build = "build"
    verify = "verify"
    report = "report"


class AttentionLowering(Enum):
    """How F.scaled_dot_product_attention reaches the program."""

    fused = "fused"  # one etb::sdpa kernel call: fastest, runs on etbuild's runtime only
    aten = "aten"  # torch's own decomposition into ATen ops, which ExecuTorch's runtime runs too


@dataclass
class LowerConfig:
    """The lower stage's choices."""

    attention: AttentionLowering = AttentionLowering.fused
    # int8 expand -> depthwise -> project chains (MobileNet blocks) and depthwise -> project
    # pairs left to etbuild's runtime become one call each (pipeline/blocks.py).
    fuse_blocks: bool = True
    # The same for Float chains, as etb:: ops: their wide tensors leave the memory plan too, but
    # ExecuTorch's runtime has no such kernels, so the program then needs etbuild's (off by
    # default: a Float program without a delegate loads in either runtime).
    fuse_float_blocks: bool = False
    # Float convolutions and the ops between them keep their activations channels-last (NHWC,
    # pipeline/layout.py): each thread's share of a layer is then one run of memory. Only
    # etbuild's runtime runs such a program (ExecuTorch's kernels take contiguous tensors).
    channels_last: bool = False


@dataclass
class EmitConfig:
    """Program-file layout."""

    constant_alignment: int = bounded(16, power_of_two=True)
    segment_alignment: int = bounded(128, power_of_two=True)


@dataclass
class VerifyConfig:
    """Running the program on the runtime against the eager model."""

    enabled: bool = True
    # fp32: max abs error allowed, as a fraction of max |eager output|.
    tolerance: float = bounded(1e-4, gt=0)
    # Quantized: extra random inputs for SQNR and top-1 agreement.
    eval_inputs: int = bounded(8, ge=0)
    # Runs of the reference input the runner times (median, p10, p90 in the report); 1: none.
    latency_iters: int = bounded(10, ge=1)
    # Seconds one run of a firmware under qemu-system-arm may take before it is killed.
    timeout_s: float = bounded(300.0, gt=0)


@dataclass
class PipelineConfig:
    """How the stage runner runs. ``stop_after`` runs a prefix of the stages.

    ``cache``: reuse the results of the stages up to ``reference`` (model.pte, the memory plan,
    the eager reference) from an earlier run whose inputs were identical: the config they read,
    the etbuild sources, the model's source file, checkpoint and calibration files, and the
    versions of python, torch and torchao. Stored under ``build.cache_dir``.
    """

    stop_after: StageName | None = None
    cache: bool = True
    lower: LowerConfig = field(default_factory=LowerConfig)
    emit: EmitConfig = field(default_factory=EmitConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)


@dataclass
class BuildConfig:
    """The runtime build (CMake + Ninja, the target's toolchain, only the selected kernels).

    Builds are cached under ``cache_dir`` (default ``$ETBUILD_CACHE_DIR``, else
    ``~/.cache/etbuild``; runtime builds in ``builds/``, stage results in ``stages/``), keyed by
    the sources, the selection, the toolchain and the flags. ``size_budget_kb`` fails the build
    when the tailored runtime (core + kernels + registration) is larger. ``compare_all_ops``
    compares with the all-ops runtime in the size report (one cached build per toolchain and
    flags). ``wheel``: for the host target, the build also makes
    ``runtime/wheel/etbuild_runtime-*.whl``, the Python module with only the selected kernels
    (``import etbuild_runtime``); other targets have no wheel.
    ``cache_max_gb``: after a run, the least recently used cache entries (runtime builds and
    stage results; never this run's) are removed until the cache is this small (null: no
    limit).
    """

    cache_dir: str | None = None
    cache_max_gb: float | None = bounded(10.0, gt=0)
    size_budget_kb: float | None = bounded(None, gt=0)
    compare_all_ops: bool = True
    wheel: bool = True


@dataclass
class SelectionConfig:
    """Which kernels the runtime is built with; by default exactly what this program uses.

    ``programs``: more program files (.pte from any ExecuTorch-format producer, or the
    selected_operators.yaml of other builds) whose operators and dtypes join the selection,
    for an app that ships several models on one runtime. ``operators``: a hand-written,
    pinned kernel set (op key -> null for every dtype ops_yaml lists, or ``{dtypes: {argument:
    [dtype names]}}``; empty: no pin); the runtime gets exactly it, and the build fails when
    a program needs a kernel or dtype outside it.
    """

    programs: list[str] = field(default_factory=list)
    operators: dict[str, Any] = field(default_factory=dict)


@dataclass
class RecipeHeader:
    """A recipe's header (a recipe file's top-level ``recipe:`` block; pipeline/recipes.py).

    ``name``: what ``etbuild --recipe NAME`` and ``etbuild-recipe`` call it (its file name
    without ``.yaml``); ``version``: the recipe's own version (PEP 440, e.g. ``1.2.0``);
    ``etbuild``: the etbuild versions it works with, a PEP 440 specifier (``>=0.1,<1``),
    checked before anything is built; ``description``: one line for ``etbuild-recipe list``.
    Stages never read it (it is not part of the stage cache key)."""

    name: str = MISSING
    version: str = MISSING
    etbuild: str | None = None
    description: str = ""


class SearchObjective(Enum):
    """What an Optuna search (``hydra/sweeper=optuna``) optimises, read from a job's manifest
    ``metrics``: ``latency_ms`` (the runner's median; minimize), ``size_kb`` (program +
    runtime; minimize), ``program_kb`` (minimize), ``planned_kb`` (all banks; minimize),
    ``sqnr_db`` (against fp32; an fp32 build counts as ``search.fp32_sqnr_db``; maximize)."""

    latency_ms = "latency_ms"
    size_kb = "size_kb"
    program_kb = "program_kb"
    planned_kb = "planned_kb"
    sqnr_db = "sqnr_db"


@dataclass
class SearchConfig:
    """What a build returns to a search sweeper (``hydra/sweeper=optuna``): one value per
    ``objectives`` entry, in order (``hydra.sweeper.direction`` must list the matching
    ``minimize``/``maximize``). A build that breaks a constraint (``max_size_kb``,
    ``max_latency_ms``, ``min_sqnr_db``) or fails returns ``penalty`` for every objective
    (its negative for a maximized one), so the sampler moves away from it; ``sweep.md`` lists
    it as infeasible. Other sweepers and single builds ignore this section."""

    objectives: list[SearchObjective] = field(
        default_factory=lambda: [
            SearchObjective.latency_ms,
            SearchObjective.size_kb,
            SearchObjective.sqnr_db,
        ]
    )
    max_size_kb: float | None = bounded(None, gt=0)
    max_latency_ms: float | None = bounded(None, gt=0)
    min_sqnr_db: float | None = None
    fp32_sqnr_db: float = 200.0
    penalty: float = bounded(1e9, gt=0)


@dataclass
class EtbuildConfig:
    """The whole manifest."""

    model: ModelConfig = MISSING
    quant: QuantConfig = field(default_factory=QuantConfig)
    partitioner: PartitionerConfig = field(default_factory=PartitionerConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    build: BuildConfig = field(default_factory=BuildConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    recipe: RecipeHeader | None = None


def register_configs() -> None:
    """Register the manifest schema; ``conf/config.yaml`` lists it first in its defaults."""
    ConfigStore.instance().store(name="etbuild_schema", node=EtbuildConfig)


def _typed_nodes(node: object, path: str) -> Iterator[tuple[str, DictConfig, type]]:
    """(path, node, schema dataclass) for every schema-typed dict in the tree under ``node``
    (missing nodes, which validate() reports, and free-form dicts such as model.args are not
    entered). Only keys the schema declares are descended into."""
    if isinstance(node, (DictConfig, ListConfig)) and node._is_missing():
        return
    if isinstance(node, ListConfig):
        for i, item in enumerate(node):
            yield from _typed_nodes(item, f"{path}[{i}]")
        return
    if not isinstance(node, DictConfig):
        return
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return
    yield path, node, schema
    declared = {f.name for f in dataclasses.fields(schema)}
    for key in node.keys():
        if key in declared:
            yield from _typed_nodes(node._get_node(key), f"{path}.{key}" if path else str(key))


def _unknown_keys(cfg: DictConfig) -> Iterator[tuple[str, str, list[str]]]:
    """(full key, parent, allowed keys) for every key a typed node has beyond its schema."""
    for path, node, schema in _typed_nodes(cfg, ""):
        allowed = [f.name for f in dataclasses.fields(schema)]
        for key in node.keys():
            if key not in allowed:
                yield f"{path}.{key}" if path else str(key), path or "the config", allowed


def _bad_values(cfg: DictConfig) -> Iterator[tuple[str, object, str]]:
    """(full key, value, what is expected) for every setting that breaks its schema field's
    metadata: a ``pattern`` a string must match in full, or a numeric ``range``."""
    for path, node, schema in _typed_nodes(cfg, ""):
        for f in dataclasses.fields(schema):
            if f.name not in node or node._get_node(f.name)._is_missing() or node[f.name] is None:
                continue
            value = node[f.name]
            full = f"{path}.{f.name}" if path else f.name
            pattern = f.metadata.get("pattern")
            if pattern is not None and not re.fullmatch(pattern, str(value)):
                yield full, value, f.metadata.get("expected", f"a value matching {pattern}")
            meta = f.metadata.get("range")
            if meta is not None:
                items = list(value) if meta["each"] else [value]
                if not all(_in_range(v, meta) for v in items):
                    shown = list(value) if meta["each"] else value
                    yield full, shown, _range_expectation(meta)


# The largest example input a build takes (each input, in bytes).
MAX_INPUT_BYTES = 1 << 30
_DTYPE_BYTES = {
    DType.float32: 4, DType.float16: 2, DType.bfloat16: 2, DType.int64: 8, DType.int32: 4,
    DType.int8: 1, DType.uint8: 1, DType.bool: 1,
}  # fmt: skip


def input_problems(mcfg: DictConfig) -> Iterator[str]:
    """What is wrong with ``model.inputs`` and ``model.dynamic_dims``, each with its fix."""
    names = [str(spec.name) for spec in mcfg.inputs]
    for i, spec in enumerate(mcfg.inputs):
        dtype = DType(spec.dtype)
        nbytes = _DTYPE_BYTES[dtype]
        for size in spec.shape:
            nbytes *= max(int(size), 0)
        if nbytes > MAX_INPUT_BYTES:
            yield (
                f"model.inputs.{i} ({spec.name}) of shape {list(spec.shape)} is "
                f"{nbytes / 2**30:.1f} GiB, over the {MAX_INPUT_BYTES >> 30} GiB an example input "
                "may take; give a smaller shape (a dynamic dim's max does not need the example)"
            )
        floating = dtype in (DType.float32, DType.float16, DType.bfloat16)
        if (spec.low is None) != (spec.high is None) and floating:
            yield (
                f"model.inputs.{i} ({spec.name}): give both low and high (uniform) or neither "
                "(standard normal)"
            )
        elif not floating and dtype != DType.bool and (spec.low is None or spec.high is None):
            yield (
                f"model.inputs.{i} ({spec.name}) has integer dtype {dtype.value}: set its value "
                f"range with low and high, e.g. model.inputs.{i}.low=0 model.inputs.{i}.high=100"
            )
        elif spec.low is not None and spec.high is not None and spec.low >= spec.high:
            yield (
                f"model.inputs.{i} ({spec.name}): low={spec.low:g} must be below high={spec.high:g}"
            )
    for d in mcfg.dynamic_dims:
        i = names.index(d.input) if d.input in names else -1
        example = list(mcfg.inputs[i].shape) if i >= 0 else []
        problem = dynamic_dim_problem(d, names, example)
        if problem:
            yield problem


def dynamic_dim_problem(d: DictConfig, names: list[str], shape: list[int]) -> str | None:
    """What is wrong with dynamic dim ``d`` of an input whose example has ``shape`` (the
    export stage checks the tensors it traces the same way), or None."""
    if d.input not in names:
        return (
            f"model.dynamic_dims[{d.name}].input={d.input!r} is not an input; "
            f"inputs are: {', '.join(names)}"
        )
    rank = len(shape)
    if not -rank <= d.dim < rank:
        return (
            f"model.dynamic_dims[{d.name}].dim={d.dim} is out of range for input "
            f"{d.input!r} of rank {rank}"
        )
    example = int(shape[d.dim])
    if not d.min <= example <= d.max:
        return (
            f"model.dynamic_dims[{d.name}]: the example size {example} of {d.input!r} dim "
            f"{d.dim} is outside [min={d.min}, max={d.max}]; widen the range or change "
            "the input shape"
        )
    if d.max < 2 or d.max <= d.min:
        return (
            f"model.dynamic_dims[{d.name}] allows sizes {d.min}..{d.max} only: a dynamic dim "
            "needs max > min and max >= 2 (torch.export fixes sizes 0 and 1 as constants). "
            "Widen the range, or remove the entry to build for the example size"
        )
    return None


def memory_problems(mem: DictConfig) -> Iterator[str]:
    """What is wrong with the bank list as a whole, each with its fix."""
    names = [str(b.name) for b in mem.banks]
    if not names:
        yield "memory.banks is empty: list at least one bank (name, size_bytes)"
    for name in sorted({n for n in names if names.count(n) > 1}):
        yield f"memory.banks: two banks are named {name!r}; give each bank its own name"
    sections = [str(b.section) for b in mem.banks if b.section is not None]
    for section in sorted({s for s in sections if sections.count(s) > 1}):
        yield f"memory.banks: two banks share linker section {section!r}; give each its own"
    holds = {str(b.name): {BankContent(h) for h in b.holds} for b in mem.banks}
    if names and not any(BankContent.activations in h for h in holds.values()):
        yield (
            "memory.banks: no bank holds activations; add 'activations' to the holds of a RAM bank"
        )
    if mem.scratch_bytes is not None and not any(BankContent.scratch in h for h in holds.values()):
        yield (
            f"memory.scratch_bytes={mem.scratch_bytes} needs a bank that holds scratch; add "
            "'scratch' to the holds of a RAM bank, or set memory.scratch_bytes=null"
        )
    if ConstantPlacement(mem.constants) == ConstantPlacement.copy:
        home = next((b for b in mem.banks if BankContent.constants in holds[str(b.name)]), None)
        if home is None:
            yield (
                "memory.constants=copy needs a bank that holds constants (where the weights "
                "live, such as flash) to copy them from; add one, or set "
                "memory.constants=in_place"
            )
        elif not any(
            BankContent.activations in holds[str(b.name)] and b.read_cost < home.read_cost
            for b in mem.banks
        ):
            yield (
                f"memory.constants=copy: no bank that holds activations reads cheaper than "
                f"the constants bank {str(home.name)!r} (read_cost {home.read_cost}), so a "
                "copy would gain nothing; set memory.constants=in_place, or give the faster "
                "bank a lower read_cost"
            )


def validate(cfg: DictConfig) -> DictConfig:
    """Check a composed config against the schema.

    Hydra's ``+key=value`` appends bypass the schema's struct mode, so a typo'd appended key
    is caught here, with the settings that do exist. String settings whose schema field
    carries a ``pattern`` (``target.march``: it reaches a compiler command line) are checked
    against it.
    """
    for full, parent, allowed in _unknown_keys(cfg):
        raise EtbuildError(
            f"unknown setting {full!r}: {parent} has no such key; its settings are: "
            f"{', '.join(allowed)}"
        )
    for full, value, expected in _bad_values(cfg):
        raise EtbuildError(f"{full}={value!r} is not valid: it must be {expected}")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise EtbuildError(
            f"these settings have no value: {', '.join(missing)}; set them on the command line "
            "(e.g. model._target_=my_pkg.make_model) or in your config"
        )
    for problem in input_problems(cfg.model):
        raise EtbuildError(problem)
    for problem in memory_problems(cfg.memory):
        raise EtbuildError(problem)
    return cfg
