"""Entry point: ``python -m etbuild.codegen`` (or ``python -m codegen`` from a checkout)."""

import sys

from .gen import main

sys.exit(main())
