"""The conformance suite imports the example backend as a user does, from its folder
(``examples/minimal_backend.py``), and runs JAX on the CPU."""

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
