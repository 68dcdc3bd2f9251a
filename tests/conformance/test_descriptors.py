"""A backend declares itself once (``BackendDescriptor``) and the commands and the suite
read the declaration:

- an installed plugin (a ``baton.plugins`` entry point) that declares a backend appears,
  in a fresh process, in ``baton backends``, in ``baton export``'s exporters (its
  checkpoints export through its exporter), in ``baton submit``'s launches (a torchrun
  job; a one-process backend is refused naming it), in ``baton compare``'s backends and
  in the conformance suite, and the writing-a-backend page's descriptor is such a plugin;
- the six backends declare what the commands listed by hand before: the exporters, the
  launches, the compared recipes and their flags;
- a malformed descriptor, or a second one under a declared name, is refused;
- the objectives a descriptor names are registered objectives (``OBJECTIVES``), checked
  when the descriptors are read: a name no package registers is refused naming the
  backend, the name and the registered ones; one registered after the backend is
  declared (a plugin's own) is accepted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from baton.core import backend_descriptor as descriptors
from baton.core.backend_descriptor import (
    BackendDescriptor,
    CompareRun,
    UnknownObjectiveError,
    backend_descriptors,
)
from baton.core.objectives import OBJECTIVES
from conformance.factories import ROOT
from support.docs_examples import docs_example

#: a plugin declaring the example backend under another name, with every fact declared
TOY_PLUGIN = {
    "toy_plugin/__init__.py": """
        from baton.core.backend_descriptor import BackendDescriptor, CompareRun, declare_backend

        declare_backend(
            BackendDescriptor(
                name="toy",
                engine="toy_plugin.engine:ToyBackend",
                summary="The example backend under another name, launched by torchrun.",
                launcher="torchrun",
                objectives=("pretrain", "sft"),
                exporter="toy_plugin.export:export_hf",
                compare=CompareRun("toy.py", flags=("--seq-len={seq_len}",)),
            )
        )
    """,
    "toy_plugin/engine.py": """
        from minimal_backend import MinimalBackend


        class ToyBackend(MinimalBackend):
            name = "toy"
    """,
    "toy_plugin/export.py": """
        from pathlib import Path

        import torch
        from safetensors.torch import save_file


        def export_hf(checkpoint_dir, out_dir):
            state = torch.load(Path(checkpoint_dir) / "backend" / "state.pt", weights_only=True)
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in state["model"].items()}, out / "model.safetensors")
            return out
    """,
    "toy_recipe.py": """
        from baton.core import Driver


        def recipe(max_steps: int = 2, run_dir: str = "runs/toy") -> Driver:
            from minimal_backend import regression_batches
            from toy_plugin.engine import ToyBackend

            backend = ToyBackend(regression_batches(8))
            return Driver(backend, max_steps=max_steps, run_dir=run_dir, save_on_stop=True)
    """,
    "minimal_recipe.py": """
        from baton.core import Driver


        def recipe(max_steps: int = 2, run_dir: str = "runs/minimal") -> Driver:
            from minimal_backend import MinimalBackend, regression_batches

            return Driver(MinimalBackend(regression_batches(8)), max_steps=max_steps, run_dir=run_dir)
    """,
    "plugins-0.1.dist-info/METADATA": """
        Metadata-Version: 2.1
        Name: baton-test-plugins
        Version: 0.1
    """,
    "plugins-0.1.dist-info/entry_points.txt": """
        [baton.plugins]
        minimal = minimal_plugin
        toy = toy_plugin
    """,
}

#: what the fresh process finds, as JSON on its last line
PROBE = """
import contextlib, io, json, sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from baton.core import Callback
from baton.core.backend_descriptor import BackendDescriptor, backend_descriptors, declare_backend
from baton.core.cli.command import main as baton
from baton.core.cli.recipe import build_driver

root = Path(sys.argv[1])
found = {"declared": [d.name for d in backend_descriptors()]}

listing = io.StringIO()
with contextlib.redirect_stdout(listing):
    baton(["backends"])
found["baton backends"] = listing.getvalue()

from baton.tools.export import exporters, main as export
found["exporters"] = list(exporters())
class KeepWeights(Callback):
    def on_train_end(self, driver):
        self.weights = {k: v.clone() for k, v in driver.backend.model.state_dict().items()}


kept = KeepWeights()
driver = build_driver(root / "toy_recipe.py", ["--run-dir", str(root / "run")])
driver.callbacks.append(kept)
driver.fit()
checkpoint = root / "run" / "checkpoints" / "latest"
found["export exit"] = export([str(checkpoint), str(root / "hf"), "--format", "hf"])
exported = load_file(str(root / "hf" / "model.safetensors"))
trained = kept.weights
found["exported the trained weights"] = sorted(exported) == sorted(trained) and all(
    torch.equal(exported[k], trained[k]) for k in trained)

from baton.tools.slurm_script import launched_by
from baton.tools.submit import main as submit
found["torchrun"], found["jax"] = list(launched_by("torchrun")), list(launched_by("jax"))
for recipe in ("toy_recipe.py", "minimal_recipe.py"):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = submit([str(root / recipe), "--dry-run", "--run-dir", str(root / "job")])
    found[f"submit {recipe}"] = [code, out.getvalue(), err.getvalue()]

from baton.tools.compare import compared, main as compare
found["compared"] = {name: run.recipe for name, run in compared().items()}
err = io.StringIO()
with contextlib.redirect_stderr(err):
    found["compare exit"] = compare(["--backends", "nope"])
found["compare error"] = err.getvalue()

from conformance.factories import suite_backends
found["conformance"] = suite_backends()

toy = next(d for d in backend_descriptors() if d.name == "toy")
declare_backend(toy)  # the same again: nothing changes
try:
    declare_backend(BackendDescriptor(name="toy", engine="elsewhere:Toy"))
except ValueError as error:
    found["declared twice"] = str(error)
print(json.dumps(found))
"""


def write_plugins(root: Path) -> None:
    """The toy plugin and the writing-a-backend page's descriptor, installed in ``root``
    as one distribution with two ``baton.plugins`` entry points."""
    files = {**TOY_PLUGIN, "minimal_plugin/__init__.py": docs_example("backend-descriptor")}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def test_a_backend_that_declares_itself_appears_in_every_list(tmp_path: Path) -> None:
    write_plugins(tmp_path)
    paths = [tmp_path, ROOT / "examples", ROOT / "tests", os.environ.get("PYTHONPATH", "")]
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(str(p) for p in paths if p),
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])

    six = ["fabric", "lightning", "torchtitan", "megatron", "maxtext", "jax"]
    assert found["declared"] == [*six, "minimal", "toy"]  # listed by order, then name
    assert "toy_plugin.engine:ToyBackend" in found["baton backends"]
    assert "minimal_backend:MinimalBackend" in found["baton backends"]

    assert found["exporters"] == ["fabric", "torchtitan", "megatron", "maxtext", "toy"]
    assert found["export exit"] == 0 and found["exported the trained weights"]

    assert found["torchrun"] == ["fabric", "lightning", "torchtitan", "megatron", "toy"]
    assert found["jax"] == ["maxtext", "jax"]
    code, script, err = found["submit toy_recipe.py"]
    assert code == 0, err
    assert "-m torch.distributed.run" in script and "toy_recipe.py" in script
    code, script, err = found["submit minimal_recipe.py"]
    assert code == 2 and not script
    assert (
        "backend 'minimal' has no SLURM launch; known: fabric, lightning, torchtitan, "
        "megatron, toy (torchrun), maxtext, jax (jax.distributed)"
    ) in err

    assert found["compared"]["toy"] == "toy.py"
    assert found["compare exit"] == 2
    assert "choose from fabric torchtitan megatron maxtext toy" in found["compare error"]

    assert found["conformance"] == ["minimal", *six, "toy"]
    assert "'toy' is already declared" in found["declared twice"]


def test_the_shipped_backends_declare_what_the_commands_read() -> None:
    from baton.tools.compare import compared
    from baton.tools.export import exporters
    from baton.tools.slurm_script import launched_by

    declared = {d.name: d for d in backend_descriptors()}
    assert list(declared) == ["fabric", "lightning", "torchtitan", "megatron", "maxtext", "jax"]
    assert list(exporters()) == ["fabric", "torchtitan", "megatron", "maxtext"]
    assert launched_by("torchrun") == ("fabric", "lightning", "torchtitan", "megatron")
    assert launched_by("jax") == ("maxtext", "jax")
    assert {name: run.recipe for name, run in compared().items()} == {
        "fabric": "hf_finetune.py",
        "torchtitan": "torchtitan_llama3_debug.py",
        "megatron": "megatron_gpt_tiny.py",
        "maxtext": "maxtext_tiny.py",
    }
    llm = ("pretrain", "sft", "dpo", "grpo")
    assert {name: d.objectives for name, d in declared.items()} == {
        "fabric": llm, "torchtitan": llm, "megatron": llm, "maxtext": llm,
        "lightning": ("pretrain",), "jax": ("pretrain",),
    }  # fmt: skip
    for name, run in compared().items():  # every recipe is the project's
        assert (ROOT / "recipes" / run.recipe).is_file(), name


def test_compare_runs_each_recipe_with_its_declared_flags(tmp_path: Path) -> None:
    from baton.tools.compare import backend_command

    shared = {"init_from": "m", "data_path": "d", "tokenizer": "t", "steps": 20, "seq_len": 8,
              "batch": 2, "lr": 2e-3, "recipes": Path("recipes")}  # fmt: skip
    fabric = backend_command("fabric", tmp_path, **shared)
    assert fabric[4] == "recipes/hf_finetune.py"
    assert fabric[-3:] == ["--seq-len=9", "--batch-size=2", "--eval-every=0"]  # 9: a window
    megatron = backend_command("megatron", tmp_path, **shared, objective="sft")
    assert "--objective=sft" in megatron
    assert megatron[-6:] == ["--seq-len=8", "--batch-size=2", "--global-batch-size=2",
                             "--eval-every=0", "--no-async-save", "--no-progress"]  # fmt: skip
    run = CompareRun("r.py", flags=("--a={seq_len}", "--b={window}", "--c={after_last_step}"))
    assert run.command_flags(seq_len=4, batch=1, steps=9) == ["--a=4", "--b=5", "--c=10"]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"engine": "no_colon"}, "engine 'no_colon' is not 'package.module:Class'"),
        ({"launcher": "slurm"}, "launcher 'slurm' is not one of"),
        ({"objectives": ()}, "it names no objective"),
        ({"exporter": "module.only"}, "exporter 'module.only' is not"),
        ({"name": ""}, "it has no name"),
    ],
)
def test_a_malformed_descriptor_is_refused(fields: dict[str, object], problem: str) -> None:
    given: dict[str, object] = {"name": "x", "engine": "pkg.mod:Cls", **fields}
    with pytest.raises(ValueError, match="backend descriptor") as error:
        BackendDescriptor(**given)  # type: ignore[arg-type]
    assert problem in str(error.value)


def test_an_objective_no_package_registers_is_refused_when_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    typo = BackendDescriptor(name="typo", engine="pkg.mod:Cls", objectives=("pretrain", "gpro"))
    monkeypatch.setitem(descriptors._DECLARED, "typo", typo)
    with pytest.raises(UnknownObjectiveError) as error:
        backend_descriptors()
    # the registered objectives: the four shipped and any an earlier test of the session
    # registered (an objective named by its file is registered in its process)
    registered = ", ".join(OBJECTIVES.names())
    assert {"dpo", "grpo", "pretrain", "sft"} <= set(OBJECTIVES.names())
    assert str(error.value) == (
        "backend 'typo' declares objective 'gpro' (did you mean 'grpo'?), which no package "
        f"registers; name one of {registered} in its objectives, or register the "
        "objective (register_objective) where the backend is declared"
    )
    assert error.value.exit_status == 2  # a UsageError: one line, exit status 2


def test_an_objective_registered_after_its_backend_is_declared_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from support.tempered_objective import TEMPERED

    own = BackendDescriptor(name="own", engine="pkg.mod:Cls", objectives=(TEMPERED.name,))
    monkeypatch.setitem(descriptors._DECLARED, "own", own)
    # not registered yet, whatever an earlier test of the session registered
    monkeypatch.delitem(OBJECTIVES._items, TEMPERED.name, raising=False)  # pyright: ignore[reportPrivateUsage]
    with pytest.raises(UnknownObjectiveError, match=f"objective {TEMPERED.name!r}"):
        backend_descriptors()
    monkeypatch.setitem(OBJECTIVES._items, TEMPERED.name, TEMPERED)  # pyright: ignore[reportPrivateUsage]
    assert own in backend_descriptors()


@pytest.mark.parametrize(
    ("excerpt", "indent"),
    [(docs_example("minimal-backend-parts"), 8), (docs_example("minimal-backend-setup"), 4)],
)
def test_the_page_shows_the_example_parts(excerpt: str, indent: int) -> None:
    source = (ROOT / "examples" / "minimal_backend.py").read_text()
    assert textwrap.indent(excerpt, " " * indent) in source, excerpt
