"""Reward functions for GRPO: TRL's signature, named on the command line, checked.

A reward function scores a step's completions, one value per completion::

    def reward(prompts, completions, completion_ids, **columns) -> list[float | None]

* ``prompts[i]``: the prompt of completion ``i`` as the data gives it (text, or a list of
  ``{"role": ..., "content": ...}`` turns); each prompt appears once per completion (G
  times in a row);
* ``completions[i]``: the completion's decoded text (special tokens skipped), or for
  conversational prompts ``[{"role": "assistant", "content": text}]``, as TRL gives it;
* ``completion_ids[i]``: its token ids (the end-of-sequence token included where one was
  generated);
* ``columns``: every other field of the prompt records (``answer=[...]``,
  ``solution=[...]``), one value per completion. A function without ``**kwargs`` gets
  only the columns it names as parameters; one that names a column the prompts lack is
  refused before the run (:meth:`Reward.check_columns`).
* It returns one float per completion, or None where it cannot score one (TRL's NaN: a
  completion no function scores gets advantage 0 and is left out of the group's mean).

Unlike TRL, baton passes no ``trainer_state``, ``log_extra`` or ``log_metric``. A TRL
reward function runs unchanged when it takes them as optional (``**kwargs`` does).

Naming them (``baton.core.cli.reward_flags``), as ``--callback`` names callbacks::

    --reward accuracy                          # a registered name (`baton rewards` lists them)
    --reward accuracy:mode=numeric,column=solution     # with settings
    --reward rewards.py:my_reward              # a function in a file (relative to here)
    --reward mypkg.rewards:my_reward           # a function in a module on the Python path
    --reward mypkg.rewards.my_reward:scale=2   # the same, dotted, with a setting
    --reward accuracy --reward format --reward-weights 1.0 0.2    # several, weighted

Settings (``:key=value,...``) bind the function's keyword-only parameters, typed from
its annotations (``1e-3`` is a float, ``[a,b]`` a list, ``Literal`` choices checked); an
unknown key gets the closest name, a wrong type or a missing required setting one line.
A setting hides a column of its name. The metric name of a reward is its registered name
or its function's name (a second reward of one name gets ``_2``, then ``_3``).
``--reward-weights`` gives one weight per ``--reward`` (default 1.0 each): the step's
reward is the weighted sum of the functions' values (None counting 0, all None: NaN).

Registering one (a plugin announces its module under the ``baton.plugins`` entry-point
group, so ``--reward NAME`` finds it without an import)::

    from baton.core.registry import register_reward
    from baton.core.rewards import checks_settings

    @register_reward("brevity")
    @checks_settings(lambda *, limit=8: None)     # optional: refuse bad settings at once
    def brevity(prompts, completions, completion_ids, *, limit: int = 8, **columns):
        '''1.0 for a completion of at most ``limit`` tokens.'''
        return [1.0 if len(ids) <= limit else 0.0 for ids in completion_ids]

Built in (:mod:`baton.core.rewards.builtins`; ``baton rewards NAME`` shows the settings):

* ``accuracy`` (``column="answer"``, ``mode="exact"|"numeric"``, ``how="auto"``,
  ``tolerance=1e-6``, ``ignore_case=False``): 1.0 where the completion's final answer
  (the last ``<answer>...</answer>``, else the last ``\\boxed{}``, else the last number
  or line) equals the prompt's reference, else 0.0; None where the reference is null or
  (numeric) not a number. A simplified math-verify: numbers (``1,250``, ``3/4``,
  ``\\frac{3}{4}``) compare as numbers, no symbolic algebra.
* ``format`` (``pattern``, default ``^<think>.*?</think>\\s*<answer>.*?</answer>\\s*$``):
  1.0 where ``re.search(pattern, text, re.DOTALL)`` matches, else 0.0.
* ``length`` (``target``, required): ``-|n - target| / target`` for ``n`` tokens.

Scoring a step (the rollout phase does it)::

    from baton.core.cli.reward_flags import load_rewards
    from baton.core.rewards import score

    rewards = load_rewards(["accuracy:mode=numeric", "format"], "1.0,0.2")
    for reward in rewards:
        reward.check_columns(prompts_data.columns)
    table = score(rewards, prompts, completions, completion_ids, {"answer": answers})
    table.rows[i], table.weights                     # then baton.core.rollouts.advantages

A function that raises, returns another number of values than completions, NaN, an
infinity or a non-number stops the run with one line naming the function and the prompt
(``UsageError``, exit status 2).
"""

from baton.core.rewards import builtins
from baton.core.rewards.answers import completion_text, final_answer, read_number
from baton.core.rewards.function import ARGUMENTS, Reward, RewardFunction, checks_settings
from baton.core.rewards.scoring import RewardTable, score

__all__ = [
    "ARGUMENTS",
    "Reward",
    "RewardFunction",
    "RewardTable",
    "builtins",
    "checks_settings",
    "completion_text",
    "final_answer",
    "read_number",
    "score",
]
