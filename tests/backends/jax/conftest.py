"""JAX-backend tests run JAX on the CPU: pin the platform before anything starts JAX."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
