"""Process hygiene for MaxText runs, as patches that undo themselves on teardown.

MaxText assumes it owns the process: its config init points ``XLA_FLAGS`` at an HLO
dump folder when the variable is empty, turns on a compilation cache in the home
directory, flips JAX settings (PRNG implementation, partitioner) and adds root-logger
handlers. Each patch below controls one of these and restores the previous state when
the run ends, so a MaxText run leaves the process as it found it.

Importing this module imports neither jax nor maxtext (``jax`` loads inside ``apply``,
which runs in ``on_configure`` of a MaxText run only).

    baton patches --backend maxtext
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from baton.core.patches import Patch, PatchRecorder, register_patch
from baton.core.quiet import Quiet, QuietPatch

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver_view import DriverView

VERSIONS = ">=0.2.5,<0.3"

#: A harmless non-empty ``XLA_FLAGS``: an empty dump target, i.e. "no dump".
NO_DUMP_XLA_FLAGS = "--xla_dump_to="

#: JAX settings MaxText's ``train.initialize`` / ``pyconfig`` change process-wide.
JAX_SETTINGS = (
    "jax_default_prng_impl",
    "jax_use_shardy_partitioner",
    "jax_remove_size_one_mesh_axis_from_type",
    "jax_compilation_cache_dir",
    "jax_debug_log_modules",
)

#: Environment variables MaxText sets at import or config time.
MAXTEXT_ENV = (
    "XLA_FLAGS",
    "LIBTPU_INIT_ARGS",
    "TFDS_DATA_DIR",
    "HF_DATASETS_DISABLE_DILL",
    "JAX_PLATFORMS",
    # maxtext/__init__.py: setdefault("TF_CPP_MIN_LOG_LEVEL", "0") turns on XLA's C++
    # INFO logging in this process and every child it starts
    "TF_CPP_MIN_LOG_LEVEL",
)


def _overrides(backend: Backend) -> dict[str, Any]:
    return getattr(backend.config, "overrides", {}) or {}


def jax_backend_started() -> bool:
    """Whether JAX has created its devices in this process (XLA flags no longer apply)."""
    import sys

    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def simulate_host_devices(recorder: PatchRecorder, count: int) -> None:
    """Make JAX start with ``count`` CPU devices (``--xla_force_host_platform_device_count``).

    Only a process whose JAX has not started yet can do this; the recorder undoes it.
    """
    if jax_backend_started():
        import jax

        if jax.device_count() == count and jax.devices()[0].platform == "cpu":
            return
        raise RuntimeError(
            f"JAX already started with {jax.device_count()} devices; simulate {count} host "
            "devices in a fresh process (before anything imports and uses JAX)"
        )
    flag = f"--xla_force_host_platform_device_count={count}"
    kept = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    recorder.setenv("XLA_FLAGS", " ".join([*kept, flag]))
    recorder.setenv("JAX_PLATFORMS", "cpu")


@register_patch
class MaxTextCpuPlatform(Patch):
    """Pin JAX to the CPU platform (JAX_PLATFORMS=cpu) before JAX starts when hardware=cpu."""

    name = "maxtext_cpu_platform"
    backend = "maxtext"
    versions = VERSIONS
    phase = "configure"

    def condition(self, backend: Backend) -> bool | tuple[bool, str]:
        hardware = _overrides(backend).get("hardware", "tpu")
        if hardware != "cpu":
            return False, f"hardware={hardware}"
        if os.environ.get("JAX_PLATFORMS"):
            return False, f"JAX_PLATFORMS={os.environ['JAX_PLATFORMS']} is already set"
        return True, "hardware=cpu"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        recorder.setenv("JAX_PLATFORMS", "cpu")


@register_patch
class MaxTextHostDevices(Patch):
    """Run on N simulated CPU devices (``MaxTextConfig.host_devices``) to try a mesh on CPU."""

    name = "maxtext_host_devices"
    backend = "maxtext"
    versions = VERSIONS
    phase = "configure"

    def condition(self, backend: Backend) -> bool | tuple[bool, str]:
        count = getattr(backend.config, "host_devices", None)
        if not count:
            return False, "host_devices not set"
        return True, f"host_devices={count}"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        simulate_host_devices(recorder, int(driver.backend.config.host_devices))


@register_patch
class MaxTextNoHloDump(Patch):
    """Stop MaxText's config init from dumping HLO on every compile (it fills an empty XLA_FLAGS)."""

    name = "maxtext_no_hlo_dump"
    backend = "maxtext"
    versions = VERSIONS
    phase = "configure"

    def condition(self, backend: Backend) -> bool | tuple[bool, str]:
        overrides = _overrides(backend)
        if overrides.get("dump_hlo") or overrides.get("dump_hlo_xla_flags"):
            return False, "the run asks for an HLO dump"
        if os.environ.get("XLA_FLAGS"):
            return False, "XLA_FLAGS is already set"
        return True, "XLA_FLAGS is empty"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        if not os.environ.get("XLA_FLAGS"):  # another patch may have set flags since
            recorder.setenv("XLA_FLAGS", NO_DUMP_XLA_FLAGS)


@register_patch
class MaxTextJaxSettings(Patch):
    """Restore the JAX settings and environment variables MaxText changes (PRNG impl, partitioner, ...)."""

    name = "maxtext_jax_settings"
    backend = "maxtext"
    versions = VERSIONS
    phase = "configure"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        for key in MAXTEXT_ENV:  # undo restores each to its value now
            recorder.setenv(key, os.environ.get(key))
        import jax  # importing jax does not start a backend; JAX_PLATFORMS still applies

        saved = {name: getattr(jax.config, name) for name in JAX_SETTINGS}

        def restore() -> None:
            for name, value in saved.items():
                if getattr(jax.config, name) != value:
                    jax.config.update(name, value)

        recorder.on_undo("restore jax.config " + ", ".join(JAX_SETTINGS), restore)


@register_patch
class MaxTextCompilationCache(Patch):
    """Keep JAX's compilation cache in the run directory instead of MaxText's ~/jax_cache."""

    name = "maxtext_compilation_cache"
    backend = "maxtext"
    versions = VERSIONS
    phase = "configure"

    def condition(self, backend: Backend) -> bool | tuple[bool, str]:
        if "jax_cache_dir" in _overrides(backend):
            return False, "the run sets jax_cache_dir"
        return True, "jax_cache_dir not set"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        cache = driver.options.run_dir.resolve() / "jax_cache"
        recorder.setitem(driver.backend.config.overrides, "jax_cache_dir", str(cache))

        def forget_cache() -> None:
            import sys

            if "jax" in sys.modules:  # the next run re-initialises with its own directory
                from jax.experimental.compilation_cache import compilation_cache

                compilation_cache.reset_cache()

        recorder.on_undo("reset the JAX compilation cache", forget_cache)


@register_patch
class MaxTextOutputDir(Patch):
    """Keep MaxText's outputs under the run directory instead of ./maxtext_output."""

    name = "maxtext_output_dir"
    backend = "maxtext"
    versions = VERSIONS
    phase = "configure"

    def condition(self, backend: Backend) -> bool | tuple[bool, str]:
        if _overrides(backend).get("base_output_directory"):
            return False, "the run sets base_output_directory"
        return True, "base_output_directory not set"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        output = driver.options.run_dir.resolve() / "maxtext"
        recorder.setitem(driver.backend.config.overrides, "base_output_directory", str(output))


@register_patch
class MaxTextRootLogger(Patch):
    """Remove the root-logger handlers and level changes MaxText (absl) makes during the run."""

    name = "maxtext_root_logger"
    backend = "maxtext"
    versions = VERSIONS
    phase = "configure"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level

        def restore() -> None:
            for handler in list(root.handlers):
                if handler not in handlers:
                    root.removeHandler(handler)
            for handler in handlers:
                if handler not in root.handlers:
                    root.addHandler(handler)
            root.setLevel(level)

        recorder.on_undo("restore root logger handlers and level", restore)


@register_patch
class MaxTextQuiet(QuietPatch):
    """Hide the notes MaxText's imports print about models a baton run does not use."""

    name = "maxtext_quiet"
    backend = "maxtext"
    distribution = "maxtext"
    versions = VERSIONS
    quiet = tuple(
        Quiet(
            f"{config} got `key=rope_scaling` in kwargs but hasn't set it as attribute",
            logger="transformers.configuration_utils",
            reason="MaxText builds Hugging Face configs of the DeepSeek models it can convert "
            "when it is imported; transformers notes their legacy RoPE keys, which no MaxText "
            "model baton trains reads",
        )
        for config in ("DeepseekV32Config", "DeepseekV4Config")
    )
