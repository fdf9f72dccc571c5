"""Where the packaged data folders live.

In a wheel they sit beside this package under ``etbuild/``; in a checkout they sit at the
repository root beside ``pipeline/``. Either way they are siblings of this package's folder.
"""

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = PACKAGE_ROOT / "conf"
OPS_YAML_DIR = PACKAGE_ROOT / "ops_yaml"
RECIPES_DIR = PACKAGE_ROOT / "recipes"
RUNTIME_SRC_DIR = PACKAGE_ROOT / "runtime_src"
