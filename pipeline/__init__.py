"""etbuild's ahead-of-time pipeline: config -> stages -> a deployment bundle."""

__version__ = "0.1.0"
