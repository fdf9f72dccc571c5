"""Kernel-registration code generation: ``ops_yaml/`` (+ an optional selection) -> C++.

``python -m etbuild.codegen --ops-yaml DIR --out DIR [--selected selected_operators.yaml]``
writes ``native_functions.h`` (the typed kernel declarations), ``register_kernels.h`` and
``register_kernels.cpp`` (the unboxing wrappers and an explicit ``register_all_kernels()``).
Files are rewritten only when their content changes.
"""

from .gen import generate, main, parse_schema

__all__ = ["generate", "main", "parse_schema"]
