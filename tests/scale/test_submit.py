"""``baton submit``: the batch script it writes, and clear errors before anything is queued."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from baton.tools.submit import JobSpec, SubmitError, batch_script, main, time_limit_seconds

RECIPE = Path(__file__).with_name("recipe_ddp.py")


def _spec(**overrides) -> JobSpec:
    base = dict(recipe="/r/x.py", recipe_args=("--lr", "1e-3"), backend="torchtitan",
                run_dir="runs/x", nodes=4, gpus_per_node=8, time="04:00:00",
                partition="gpu", output_dir="/runs/x/slurm", workdir="/w", python="/py")  # fmt: skip
    return JobSpec(**{**base, **overrides})


def test_torch_backends_run_torchrun_once_per_node_with_c10d_on_the_first_node() -> None:
    script = batch_script(_spec())
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --signal=USR1@120", "#SBATCH --requeue", "#SBATCH --partition=gpu",
                 "#SBATCH --cpus-per-task=64", "#SBATCH --mem=256G"):  # fmt: skip
        assert line in script.splitlines(), line  # by default 8 cores and 32G per worker
    srun = script.splitlines()[-1]
    assert srun.startswith("srun --kill-on-bad-exit=1 --cpus-per-task=64 bash -c ")
    for part in ('--nnodes "$SLURM_NNODES"', '--node-rank "$SLURM_NODEID"', "--nproc-per-node 8",
                 '--rdzv-backend c10d --rdzv-endpoint "$BATON_HEAD_NODE:29400"',
                 "run /r/x.py --lr 1e-3 --resume auto", 'trap "" USR1'):  # fmt: skip
        assert part in srun, part


def test_jax_backends_run_one_task_per_process_without_torchrun() -> None:
    script = batch_script(_spec(backend="maxtext", gpus_per_node=0, procs_per_node=2))
    assert "#SBATCH --ntasks-per-node=2" in script
    assert "#SBATCH --cpus-per-task=8" in script and "#SBATCH --mem=64G" in script
    assert (
        "torch.distributed.run" not in script and "-m baton.core.cli.command run /r/x.py" in script
    )


def test_the_script_runs_in_a_shell(tmp_path: Path) -> None:
    """The script is valid bash (syntax-checked by bash itself)."""
    path = tmp_path / "job.sbatch"
    path.write_text(batch_script(_spec()))
    subprocess.run(["bash", "-n", str(path)], check=True)


@pytest.mark.parametrize(
    "text, seconds", [("04:00:00", 14400), ("1-00:00:30", 86430), ("00:01:00", 60)]
)
def test_time_limits(text: str, seconds: int) -> None:
    assert time_limit_seconds(text) == seconds


@pytest.mark.parametrize(
    "spec, message",
    [
        (dict(time="4h"), "is not [D-]HH:MM:SS"),
        (dict(time="00:01:00", signal_lead_s=120), "lower --signal-lead"),
    ],
)
def test_bad_specs_are_named(spec: dict, message: str) -> None:
    with pytest.raises(SubmitError, match=message.replace("[", r"\[")):
        batch_script(_spec(**spec))


def test_submit_errors_before_queueing(tmp_path: Path, monkeypatch, capsys) -> None:
    def submit(*args: str) -> tuple[int, str, str]:
        code = main([str(RECIPE), "--run-dir", str(tmp_path), *args])
        out, err = capsys.readouterr()
        return code, out, err

    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no sbatch here
    code, _, err = submit()
    assert code == 2 and "sbatch is not on PATH" in err and "--dry-run" in err
    code, _, err = submit("--resume", "auto", "--dry-run")
    assert code == 2 and "always runs with --resume auto" in err
    code, _, err = submit("--max-stepz", "3", "--dry-run")
    assert code == 2 and "--max-stepz" in err
    code, out, _ = submit("--nodes", "2", "--time", "00:30:00", "--dry-run")
    assert code == 0 and "#SBATCH --nodes=2" in out and "--run-dir" in out
    # the printed script can be queued as it is: SLURM opens --output before it runs
    assert f"#SBATCH --output={tmp_path / 'slurm'}/slurm-%j.out" in out
    assert (tmp_path / "slurm").is_dir() and not list((tmp_path / "slurm").iterdir())


PLANNING_RECIPE = """
from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.core import Driver
from baton.core.errors import RecipeError

def recipe(run_dir: str, tp: int = 1, gpus: int = 8, dry_run: bool = False,
           data_path: str | None = None) -> Driver | None:
    if dry_run:
        if gpus % tp:
            raise RecipeError(f"tp({tp}) does not divide WORLD_SIZE({gpus})")
        print(f"plan: dp {gpus // tp} x tp {tp}")
        return None
    if data_path is None:
        raise RecipeError("pass --data-path: this recipe trains on real data only")
    model = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32)
    return Driver(GPTTraining(model=model).backend(), max_steps=3, run_dir=run_dir)
"""


def test_the_recipe_plans_the_jobs_layout_first(tmp_path: Path, monkeypatch, capsys) -> None:
    """The recipe's own --dry-run plans the job's world size (nodes x GPUs) before any
    script is written; the recipe's refusals are named, and submit's --dry-run is not the
    recipe's."""
    recipe = tmp_path / "planned.py"
    recipe.write_text(PLANNING_RECIPE)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))

    def submit(*args: str) -> tuple[int, str, str]:
        code = main([str(recipe), "--run-dir", str(tmp_path / "run"), "--dry-run", *args])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = submit("--nodes", "2", "--gpus-per-node", "8", "--tp", "4", "--data-path", "d")
    assert code == 0 and "#SBATCH --nodes=2" in out, err
    code, out, err = submit("--nodes", "4", "--gpus-per-node", "8", "--tp", "3", "--data-path", "d")
    assert code == 2 and not out
    assert "refuses the job's layout for 32 ranks (4 nodes x 8; its own --dry-run --gpus 32)" in err
    assert "tp(3) does not divide WORLD_SIZE(32)" in err
    code, _, err = submit("--nodes", "2", "--gpus-per-node", "8")
    assert code == 2 and "pass --data-path" in err
    assert "baton submit's --dry-run only prints the script" in err


def test_kubernetes_example_runs_a_recipe_baton_accepts() -> None:
    import yaml

    root = Path(__file__).parents[2]
    job = yaml.safe_load((root / "examples/kubernetes/pytorchjob.yaml").read_text())
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[:4] == ["torchrun", "-m", "baton.core.cli.command", "run"]
    assert (root / command[4]).is_file() and command[-2:] == ["--resume", "auto"]
    assert job["spec"]["elasticPolicy"]["rdzvBackend"] == "c10d"


def test_a_gpu_job_trains_on_the_gpus(tmp_path: Path, monkeypatch, capsys) -> None:
    """A GPU job gets the recipe's --accelerator cuda, refuses a CPU accelerator, asks for
    CPU cores and memory when told, and says that the nodes must share the filesystem."""
    root = Path(__file__).parents[2]
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    quickstart = str(root / "recipes" / "quickstart.py")

    def submit(recipe: str, *args: str) -> tuple[int, str, str]:
        code = main([recipe, "--run-dir", str(tmp_path), "--dry-run", *args])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = submit(quickstart, "--nodes", "2", "--gpus-per-node", "8",
                            "--cpus-per-task", "64", "--mem", "480G")  # fmt: skip
    assert code == 0, err
    assert "--accelerator cuda" in out.splitlines()[-1]
    assert "#SBATCH --cpus-per-task=64" in out and "#SBATCH --mem=480G" in out
    assert "shared filesystem" in err
    code, _, err = submit(quickstart, "--gpus-per-node", "8", "--accelerator", "cpu")
    assert code == 2 and "train on the CPU" in err and "--accelerator cuda" in err
    code, out, _ = submit(quickstart)  # a CPU job keeps the recipe's CPU default
    assert code == 0 and "--accelerator" not in out
    lightning = str(root / "recipes" / "lightning_module.py")  # accelerator fixed in code
    code, _, err = submit(lightning, "--gpus-per-node", "4")
    assert code == 2 and "accelerator='cpu'" in err
    code, _, err = submit(quickstart, "--mem", "lots")
    assert code == 2 and "--mem 'lots'" in err
    maxtext = str(root / "recipes" / "maxtext_tiny.py")  # MaxText's hardware=cpu
    code, _, err = submit(maxtext, "--nodes", "2", "--gpus-per-node", "4")
    assert code == 2 and "configures its backend with hardware=cpu" in err


def test_the_8b_recipe_plans_the_jobs_layout_before_a_script_is_written(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """The issue's case: `--nodes 4 --gpus-per-node 8 --tp 3` on the TorchTitan 8B recipe is
    refused in the recipe's own words (its backend's dry run for the job's 32 ranks)."""
    pytest.importorskip("torchtitan")
    from baton.data import train_tokenizer

    tokenizer = str(train_tokenizer(tmp_path / "tok", vocab_size=512).path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "one document"}\n')
    recipe = Path(__file__).parents[2] / "recipes" / "torchtitan_llama3_8b.py"
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    code = main([str(recipe), "--nodes", "4", "--gpus-per-node", "8", "--tp", "3", "--dry-run",
                 "--data-path", str(corpus), "--tokenizer", tokenizer,
                 "--run-dir", str(tmp_path / "run")])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2 and not out, err
    assert (
        "refuses the job's layout for 32 ranks (4 nodes x 8; its own --dry-run --world-size 32)"
        in err
    )
    assert (
        "--tp 3 does not divide the model's 32 attention heads; use a --tp that divides 32" in err
    )
