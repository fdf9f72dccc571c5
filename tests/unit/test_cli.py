"""The command on its own: `etbuild --version` and `etbuild --help` (conf/config.yaml's
hydra.help template), and what a bad option under --help gives."""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path

from etbuild_test_support import run_cli

from etbuild.pipeline import __version__
from etbuild.pipeline.cli import version_line
from etbuild.pipeline.paths import CONF_DIR


def test_version_is_etbuilds(tmp_path: Path) -> None:
    assert __version__ == importlib.metadata.version("etbuild")
    expected = (
        f"etbuild {__version__} (python {platform.python_version()}, "
        f"torch {importlib.metadata.version('torch')}, "
        f"torchao {importlib.metadata.version('torchao')}, "
        f"hydra-core {importlib.metadata.version('hydra-core')})"
    )
    assert version_line() == expected
    for args in (["--version"], ["model=mlp", "--version"]):
        proc = run_cli(args, tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == expected + "\n"
        assert proc.stderr == ""
    assert not (tmp_path / "outputs").exists()  # nothing was built


def _options(group: str) -> str:
    return ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))


def test_help_gives_usage_groups_options_and_examples(tmp_path: Path) -> None:
    proc = run_cli(["--help"], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("etbuild: a PyTorch model in, a verified deployment bundle out")
    for section in ("== Usage ==", "== Config groups ==", "== Examples ==", "== Flags =="):
        assert section in out, section
    assert "  etbuild -m GROUP=A,B KEY=X,Y ..." in out
    # every group with its options, as the packaged conf/ tree has them
    for group in ("memory", "model", "partitioner", "quant", "target"):
        assert f"\n{group}: {_options(group)}\n" in out, group
    assert (
        "\nmodel: custom, ds_cnn, fc_autoencoder, mlp, mobilenet, mobilenet_v1_vww, "
        "mobilenet_v3_small, resnet18, resnet8, transformer\n"
    ) in out
    assert "  quant        +quant=OPTION (absent: fp32): ptq, qat or dynamic int8" in out
    assert "  etbuild model=resnet18 +quant=ptq           int8, post-training quantization" in out
    assert "  etbuild -m model=mlp,transformer +quant=none,ptq    a sweep of four builds" in out
    assert "  --version                   etbuild's version" in out
    assert "(default $ETBUILD_CACHE_DIR," in out  # a literal dollar sign, not a substitution
    assert 'eval "$(etbuild -sc install=bash)"' in out
    assert "Hydra" not in out.replace("Hydra's own help", "")
    assert "$APP_CONFIG_GROUPS" not in out
    assert not (tmp_path / "outputs").exists()


def test_help_lists_the_options_of_a_config_dir(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    (recipes / "model").mkdir(parents=True)
    (recipes / "model" / "tiny.yaml").write_text((CONF_DIR / "model" / "mlp.yaml").read_text())
    (recipes / "tiny_host.yaml").write_text(
        "defaults:\n  - config\n  - override /model: tiny\n  - _self_\n"
    )
    proc = run_cli(["--config-dir", str(recipes), "--config-name", "tiny_host", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    with_tiny = ", ".join(sorted([*_options("model").split(", "), "tiny"]))
    assert f"\nmodel: {with_tiny}\n" in proc.stdout
    assert "== Examples ==" in proc.stdout


def test_help_with_an_unknown_option_names_it_without_a_traceback(tmp_path: Path) -> None:
    proc = run_cli(["--help", "model=nope"], tmp_path, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith("etbuild: error: In 'config': Could not find 'model/nope'\n")
    assert "Available options in 'model':\n\tcustom\n\tds_cnn\n" in proc.stderr
    assert "Traceback" not in proc.stderr

    proc = run_cli(["--help", "memory.alignment=abc"], tmp_path, timeout=120)
    assert proc.returncode == 1
    assert "etbuild: error: Error merging override memory.alignment=abc\n" in proc.stderr
    assert "Value 'abc' of type 'str' could not be converted to Integer" in proc.stderr
    assert "Traceback" not in proc.stderr
