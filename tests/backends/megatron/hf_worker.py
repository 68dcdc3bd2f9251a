"""Run a recipe under torchrun: ``torchrun ... hf_worker.py RECIPE ARGS...``."""

from __future__ import annotations

import sys

from baton.core.cli.recipe import build_driver

if __name__ == "__main__":
    build_driver(sys.argv[1], sys.argv[2:]).fit()
