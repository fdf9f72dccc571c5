"""etbuild: a PyTorch model and a Hydra config in, an ExecuTorch-format program and a tailored
C++ runtime out.

The Python API mirrors the command line (pipeline/api.py)::

    import etbuild

    result = etbuild.build(["model=mlp", "+quant=ptq"])
    print(result.status, result.model_pte, result.metrics["program_bytes"])

    sweep = etbuild.sweep(["model=mlp", "+quant=none,ptq"])
    print(sweep.sweep_md, [r.status for r in sweep.results])

This file is the top of the installed package (CMakeLists.txt installs it as
``etbuild/__init__.py``); the subpackages (``etbuild.pipeline``, ``etbuild.codegen``, ...)
come from the repository's top-level folders.
"""

from etbuild.pipeline import __version__
from etbuild.pipeline.api import BuildResult, SweepResult, build, sweep
from etbuild.pipeline.errors import EtbuildError

__all__ = ["BuildResult", "EtbuildError", "SweepResult", "__version__", "build", "sweep"]
