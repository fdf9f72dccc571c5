"""Kernel-registration code generation: ``ops_yaml/`` (+ an optional selection) -> C++.

``python -m etbuild.codegen --ops-yaml DIR --out DIR [--selected selected_operators.yaml]``
writes ``native_functions.h`` (the typed kernel declarations), ``register_kernels.h`` and
``register_kernels.cpp`` (per op an argument check, run at Method load and before each call,
the unboxing wrappers and an explicit ``register_all_kernels()``), and ``selected_dtypes.h``
(the compile-time (op, tensor argument) -> dtypes table the kernels' dtype dispatch consults,
so unselected dtype paths are not compiled in). Files are rewritten only when their content
changes.
"""

from .gen import generate, main
from .opdb import load_entries, parse_schema

__all__ = ["generate", "load_entries", "main", "parse_schema"]
