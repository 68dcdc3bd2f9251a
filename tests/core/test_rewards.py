"""Reward functions for GRPO: the registry and plugins, every form of ``--reward`` with its
settings, ``--reward-weights``, the built-in rewards' values, and every refusal of a bad
reward (one line naming the function and the prompt)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from baton.core import registry
from baton.core.cli.command import main
from baton.core.cli.reward_flags import (
    load_rewards,
    parse_reward_weights,
    reward_record,
    rewards_from_records,
)
from baton.core.errors import UsageError
from baton.core.registry import REWARDS, register_reward
from baton.core.rewards import Reward, score
from baton.core.rewards.builtins import accuracy, format_reward, length

MY_REWARDS = '''
def brevity(prompts, completions, completion_ids, *, limit: int = 8, bonus: float = 1.0, **columns):
    """Bonus for a completion of at most ``limit`` tokens.

    Args:
        limit: the longest completion rewarded.
        bonus: its reward.
    """
    return [bonus if len(ids) <= limit else 0.0 for ids in completion_ids]


def exact(completions, answer):
    """Takes only the completions and the answer column (no **kwargs)."""
    return [float(c == a) for c, a in zip(completions, answer)]


def raises_on_c(prompts, completions, completion_ids, **columns):
    return [1.0 / (p != "c") for p in prompts]


def counted(prompts, completions, completion_ids, *, count: int, **columns):
    return [0.0] * count


def gives(prompts, completions, completion_ids, *, what: str, **columns):
    values = {"nan": float("nan"), "inf": float("inf"), "text": "high", "none": None}
    return [values[what]] + [1.0] * (len(completions) - 1)


def gives_a_dict(prompts, completions, completion_ids, **columns):
    return {"score": 1.0}


class NotAFunction:
    pass


NUMBER = 3
'''


@pytest.fixture
def my_rewards(tmp_path: Path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(MY_REWARDS)
    return path


@pytest.fixture
def rewards_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``mypkg.rewards`` importable (the directory on the Python path), with MY_REWARDS."""
    package = tmp_path / "site" / "mypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "rewards.py").write_text(MY_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return "mypkg.rewards"


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewards registered by a test leave with it."""
    monkeypatch.setattr(REWARDS, "_items", dict(REWARDS._items))  # pyright: ignore[reportPrivateUsage]


def baton(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


PROMPTS = ["a", "a", "b", "b", "c", "c"]
COMPLETIONS = ["x", "yy", "<answer>4</answer>", "4", "z", "<answer> 4 </answer>"]
IDS = [[5], [5, 6], [1, 2, 3], [7], [8, 9, 10, 11], [3]]


def scored(rewards: list[Reward], columns: dict[str, list[Any]] | None = None):
    return score(rewards, PROMPTS, COMPLETIONS, IDS, columns or {"answer": ["4"] * 6})


# ---- registry and names --------------------------------------------------------------


def test_built_in_rewards_are_registered() -> None:
    import baton.core.rewards  # noqa: F401  (registers them)

    assert {"accuracy", "format", "length"} <= set(REWARDS.names())
    assert REWARDS.get("accuracy") is accuracy
    assert REWARDS.get("format") is format_reward
    assert REWARDS.get("length") is length


def test_a_registered_reward_is_named_with_settings(clean_registry: None) -> None:
    @register_reward("short")
    def short(prompts, completions, completion_ids, *, limit: int = 2, **columns):
        return [float(len(ids) <= limit) for ids in completion_ids]

    (reward,) = load_rewards(["short:limit=1"])
    assert (reward.name, dict(reward.settings), reward.function) == ("short", {"limit": 1}, short)
    assert scored([reward]).values("short") == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]


def test_a_plugin_registers_rewards_by_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registry: None
) -> None:
    """A distribution announcing its module under ``baton.plugins``: ``--reward NAME``
    finds its rewards without anything imported first."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "reward_plugin.py").write_text(
        "from baton.core.registry import register_reward\n"
        "@register_reward('plugin_length')\n"
        "def plugin_length(prompts, completions, completion_ids, *, scale: float = 1.0, **c):\n"
        "    return [scale * len(ids) for ids in completion_ids]\n"
    )
    info = site / "reward_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: reward-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[baton.plugins]\nreward_plugin = reward_plugin\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    (reward,) = load_rewards(["plugin_length:scale=0.5"])
    assert reward.name == "plugin_length" and reward.settings == {"scale": 0.5}
    assert scored([reward]).values("plugin_length") == [0.5, 1.0, 1.5, 0.5, 2.0, 0.5]


def test_a_reward_from_a_file_a_module_or_a_dotted_name(
    my_rewards: Path,
    rewards_package: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    given = [
        "my_rewards.py:brevity:limit=1,bonus=2",  # a file, relative to the working directory
        f"{rewards_package}:brevity:limit=3",  # a module on the Python path
        f"{rewards_package}.brevity",  # the same, dotted
    ]
    first, second, third = load_rewards(given, "1,0.5,0.25")
    assert first.spec == f"{my_rewards}:brevity"  # resolved: a resume finds it from elsewhere
    assert (first.settings, second.settings, third.settings) == (
        {"limit": 1, "bonus": 2.0},
        {"limit": 3},
        {},
    )
    assert isinstance(first.settings["bonus"], float)  # typed from the annotation
    assert (second.spec, third.spec) == (f"{rewards_package}:brevity",) * 2
    assert [r.name for r in (first, second, third)] == ["brevity", "brevity_2", "brevity_3"]
    assert [r.weight for r in (first, second, third)] == [1.0, 0.5, 0.25]
    table = scored([first, second, third])
    assert table.names == ("brevity", "brevity_2", "brevity_3")
    assert table.weights == (1.0, 0.5, 0.25)
    assert table.values("brevity") == [2.0, 0.0, 0.0, 2.0, 0.0, 2.0]
    assert table.values("brevity_2") == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert table.row(1) == {"brevity": 0.0, "brevity_2": 1.0, "brevity_3": 1.0}
    # recorded, and built again from the record (a resume)
    records = [reward_record(r) for r in (first, second, third)]
    assert records[0] == {"name": f"{my_rewards}:brevity", "weight": 1.0, "limit": 1, "bonus": 2.0}
    again = rewards_from_records(records, "checkpoint step_000004")
    assert [(r.name, dict(r.settings), r.weight) for r in again] == [
        ("brevity", {"limit": 1, "bonus": 2.0}, 1.0),
        ("brevity_2", {"limit": 3, "bonus": 1.0}, 0.5),
        ("brevity_3", {"limit": 8, "bonus": 1.0}, 0.25),
    ]


def test_a_function_without_kwargs_gets_only_its_columns(my_rewards: Path) -> None:
    (reward,) = load_rewards([f"{my_rewards}:exact"])
    columns = {"answer": ["x", "y", "z", "4", "z", "q"], "level": [1] * 6}
    assert scored([reward], columns).values("exact") == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    reward.check_columns(["answer", "level"])
    with pytest.raises(UsageError) as error:
        reward.check_columns(["solution"])
    assert str(error.value) == (
        f"--reward {my_rewards}:exact: exact takes the column 'answer', which the prompts lack "
        "(their columns: solution); add it to the prompt records, or give the parameter a "
        "default"
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("acuracy", "--reward acuracy: unknown reward 'acuracy'; did you mean 'accuracy'?"),
        ("zzz", "unknown reward 'zzz'; registered rewards: accuracy, format, length"),
        ("missing.py:fn", "reward file {dir}/missing.py does not exist; give the path of a"),
        ("{file}:brevty", "defines no function 'brevty'; did you mean 'brevity'?"),
        ("{file}:NotAFunction", "{file}:NotAFunction is a type, not a function; name a function"),
        ("{file}:NUMBER", "{file}:NUMBER is a int, not a function"),
        ("{file}", "name the function in {file}, e.g. --reward {file}:my_reward"),
        ("nosuchpkg.rewards:fn", "no module named 'nosuchpkg.rewards'; install the package"),
        ("{file}:brevity:limit=many", "limit is 'many', not a whole number"),
        ("{file}:brevity:limt=2", "brevity has no argument 'limt'; did you mean 'limit'?"),
        ("{file}:brevity:2", "'2' is not key=value; write --reward {file}:brevity:key=value"),
        ("length", "--reward length: length needs target; give target=VALUE"),
        ("length:target=0", "--reward length:target=0: target is 0; give a length of at least 1"),
        ("format:pattern=(", "--reward format:pattern=(: pattern '(' is not a regular expression"),
        ("accuracy:mode=fuzzy", "mode is 'fuzzy', not one of 'exact', 'numeric'"),
        ("accuracy:tolerance=-1", "tolerance is -1.0; give a number at least 0"),
    ],
)
def test_a_bad_reward_flag_is_one_line(
    my_rewards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    names = {"file": str(my_rewards), "dir": str(tmp_path)}
    with pytest.raises(UsageError) as error:
        load_rewards([given.format(**names)])
    assert message.format(**names) in str(error.value)
    assert "\n" not in str(error.value) and error.value.exit_status == 2


def test_reward_weights() -> None:
    assert parse_reward_weights(None, 3) == (1.0, 1.0, 1.0)
    assert parse_reward_weights("1, 0.5,-2e-1", 3) == (1.0, 0.5, -0.2)
    assert parse_reward_weights([1, 2], 2) == (1.0, 2.0)
    for weights, message in [
        ("1,2", "--reward-weights gives 2 weights for 3 rewards; give one per --reward"),
        ("1,x,2", "--reward-weights: 'x' is not a number; give one number per --reward"),
        ("1,nan,2", "--reward-weights: 'nan' is not a finite number"),
    ]:
        with pytest.raises(UsageError, match=message):
            parse_reward_weights(weights, 3)
    with pytest.raises(UsageError, match="GRPO needs a reward: give --reward NAME"):
        load_rewards([])


# ---- the built-in rewards --------------------------------------------------------------


def call(function: Any, completions: list[Any], **kwargs: Any) -> list[float | None]:
    n = len(completions)
    return function(["p"] * n, completions, [[1]] * n, **kwargs)


def test_accuracy_finds_the_final_answer_and_compares_it() -> None:
    completions = [
        "<think>2+2 is 4, not 5</think><answer> 4 </answer>",  # the answer tag, stripped
        "<answer>5</answer> then <answer>4</answer>",  # the last tag
        r"so \boxed{4}",  # \boxed{}, when no tag
        r"first \boxed{5} then \boxed{\frac{8}{2}}",  # the last one, braces balanced
        "I think\nthe answer is 4",  # the last line (exact) / the last number (numeric)
        "no answer here",
        "",
    ]
    answers = {"answer": ["4"] * len(completions)}
    assert call(accuracy, completions, **answers) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    numeric = call(accuracy, completions, mode="numeric", **answers)
    assert numeric == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    # the whole last line in exact mode; the reference as text, whitespace evened out
    assert call(accuracy, ["x\n  The  Answer is 4 "], answer=["the answer is 4"]) == [0.0]
    got = call(accuracy, ["x\n  The  Answer is 4 "], answer=["the answer is 4"], ignore_case=True)
    assert got == [1.0]
    # one rule only
    assert call(accuracy, [r"<answer>5</answer> \boxed{4}"], answer=["4"], how="boxed") == [1.0]
    assert call(accuracy, [r"<answer>5</answer> \boxed{4}"], answer=["4"]) == [0.0]
    assert call(accuracy, ["  4  "], answer=["4"], how="whole") == [1.0]


def test_accuracy_reads_numbers_as_people_write_them() -> None:
    pairs = [
        ("It costs $1,250.", "1250"),
        ("<answer>3/4</answer>", "0.75"),
        (r"\boxed{\dfrac{3}{4}}", "0.75"),
        ("<answer>50%</answer>", "50"),
        ("<answer>-3.5</answer>", "#### -3.5"),  # a GSM8K-style reference: its last number
        ("<answer>2.0000001</answer>", "2"),  # within the tolerance
    ]
    completions = [completion for completion, _ in pairs]
    references = [reference for _, reference in pairs]
    assert call(accuracy, completions, mode="numeric", answer=references) == [1.0] * 6
    assert call(accuracy, ["<answer>2.01</answer>"], mode="numeric", answer=["2"]) == [0.0]
    got = call(accuracy, ["<answer>2.01</answer>"], mode="numeric", answer=["2"], tolerance=0.01)
    assert got == [1.0]
    # numbers from Parquet stay numbers; a reference that is no number cannot be scored
    assert call(accuracy, ["<answer>7</answer>"] * 3, mode="numeric", answer=[7, 7.0, "seven"]) == [
        1.0,
        1.0,
        None,
    ]
    # a null reference cannot be scored in either mode
    assert call(accuracy, ["4"], answer=[None]) == [None]
    # another column, and conversational completions
    turns = [[{"role": "assistant", "content": "<answer>4</answer>"}]]
    assert call(accuracy, turns, column="solution", solution=["4"]) == [1.0]
    with pytest.raises(
        ValueError, match=r"the prompts have no column 'answer' \(their columns: solution\); pass"
    ):
        call(accuracy, ["4"], solution=["4"])


def test_format_matches_the_pattern() -> None:
    completions = [
        "<think>reasoning\nover lines</think>\n<answer>4</answer>",
        "<think>r</think><answer>4</answer>\n",
        "<answer>4</answer>",
        "<think>r</think><answer>4</answer> and more",
        "preamble <think>r</think><answer>4</answer>",
        [{"role": "assistant", "content": "<think>r</think> <answer>4</answer>"}],
    ]
    assert call(format_reward, completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert call(format_reward, completions, pattern=r"<answer>\d+</answer>") == [1.0] * 6


def test_length_rewards_the_target_length() -> None:
    ids = [[1] * n for n in (0, 2, 4, 6, 8, 10)]
    assert length(["p"] * 6, [""] * 6, ids, target=4) == [-1.0, -0.5, 0.0, -0.5, -1.0, -1.5]


# ---- scoring ---------------------------------------------------------------------------


def test_score_calls_each_reward_once_on_all_completions(my_rewards: Path) -> None:
    calls: list[int] = []

    def counting(prompts, completions, completion_ids, **columns):
        calls.append(len(completions))
        return [None if p == "b" else 1.0 for p in prompts]  # None: cannot score

    rewards = [Reward("counting", counting, weight=0.5), *load_rewards(["accuracy"])]
    table = scored(rewards)
    assert calls == [6]
    assert table.names == ("counting", "accuracy") and table.weights == (0.5, 1.0)
    assert table.rows == (
        (1.0, 0.0),
        (1.0, 0.0),
        (None, 1.0),
        (None, 1.0),
        (1.0, 0.0),
        (1.0, 1.0),
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            "{file}:raises_on_c",
            "--reward {file}:raises_on_c: raises_on_c raised ZeroDivisionError: float division "
            "by zero on prompt 'c'; fix the reward function, or return None for a completion it "
            "cannot score",
        ),
        (
            "{file}:counted:count=4",
            "--reward {file}:counted:count=4: counted returned 4 values for 6 completions; "
            "return one per completion (None for one it cannot score)",
        ),
        (
            "{file}:gives:what=nan",
            "--reward {file}:gives:what=nan: gives returned NaN for completion 0 (prompt 'a'); "
            "return None for a completion it cannot score",
        ),
        (
            "{file}:gives:what=inf",
            "gives returned inf for completion 0 (prompt 'a'); return a finite number",
        ),
        (
            "{file}:gives:what=text",
            "gives returned 'high' (str) for completion 0 (prompt 'a'), not a number; return a "
            "float, or None for a completion it cannot score",
        ),
        (
            "{file}:gives_a_dict",
            "gives_a_dict returned a dict, not a list; return one number (or None) per completion",
        ),
        (
            "accuracy:column=solution",
            "--reward accuracy:column=solution: accuracy raised ValueError: the prompts have no "
            "column 'solution' (their columns: answer); pass --reward accuracy:column=NAME on "
            "prompt 'a'",
        ),
    ],
)
def test_a_bad_reward_stops_the_run_in_one_line(my_rewards: Path, given: str, message: str) -> None:
    rewards = load_rewards([given.format(file=my_rewards)])
    with pytest.raises(UsageError) as error:
        scored(rewards)
    assert message.format(file=my_rewards) in str(error.value)
    assert "\n" not in str(error.value) and error.value.exit_status == 2


def test_none_is_a_value(my_rewards: Path) -> None:
    (reward,) = load_rewards([f"{my_rewards}:gives:what=none"])
    assert scored([reward]).values("gives") == [None, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_baton_rewards_lists_them_and_their_settings(
    capsys: pytest.CaptureFixture[str], my_rewards: Path
) -> None:
    status, out = baton(capsys, "rewards")
    assert status == 0
    for name in ("accuracy", "format", "length"):
        assert name in out
    status, out = baton(capsys, "rewards", "length")
    assert status == 0 and "target" in out and "(required)" in out
    assert "use: baton run RECIPE.py --reward length:target=VALUE" in out
    status, out = baton(capsys, "rewards", f"{my_rewards}:brevity")
    assert status == 0 and "limit" in out and "the longest completion rewarded" in out
    status, out = baton(capsys, "rewards", "lenght")
    assert status == 2 and "did you mean 'length'?" in out


def test_a_reward_of_a_top_level_module_and_a_name_that_is_also_a_reward(
    my_rewards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--reward MODULE:fn`` of a module outside any package (on the Python path) is that
    function; where ``MODULE`` is also a registered reward the flag says how to write each
    meaning."""
    monkeypatch.syspath_prepend(str(my_rewards.parent))
    monkeypatch.delitem(__import__("sys").modules, my_rewards.stem, raising=False)
    (reward,) = load_rewards([f"{my_rewards.stem}:brevity:limit=2"])
    assert (reward.spec, dict(reward.settings)) == (f"{my_rewards.stem}:brevity", {"limit": 2})
    with pytest.raises(UsageError) as error:
        load_rewards(["accuracy:brevity"])
    assert str(error.value) == (
        "--reward accuracy:brevity: 'accuracy' is a registered reward and 'brevity' is not "
        "key=value; for the registered reward write --reward accuracy:key=value, for the "
        "function brevity of a module accuracy write --reward accuracy.brevity"
    )
