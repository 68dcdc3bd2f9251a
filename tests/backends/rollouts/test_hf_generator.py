"""The transformers generator: TRL's sampling, the log-probabilities of a full forward,
its own random state, strict weight loading only when the weights changed; and the
reference scorer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from baton.backends.rollouts.hf_generator import TransformersGenerator
from baton.backends.rollouts.scoring import ReferenceScorer
from baton.core.errors import UsageError
from baton.core.rollouts.generator import Sampling
from baton.data.rollouts import Rollout, RolloutBatch
from support.tiny_llama import load_llama, save_tiny_llama

VOCAB = 64
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [4, 5]]
#: a stop id the tiny model samples now and then, so some completions end and some do not
SAMPLING = Sampling(temperature=0.7, top_p=0.9, top_k=20, max_tokens=12, stop_ids=(5, 9), pad_id=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("policy") / "hf", vocab_size=VOCAB, seed=0)


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("other") / "hf", vocab_size=VOCAB, seed=1)


def full_forward_logps(model, prompt, completion, temperature):
    """log-softmax(logits / T) of a forward over prompt + completion, no padding."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logps = torch.log_softmax(logits / temperature, dim=-1)
    picked = logps[len(prompt) - 1 : -1].gather(-1, torch.tensor(completion)[:, None])[:, 0]
    return picked.numpy()


def test_completions_are_transformers_generate_with_trls_settings(model_dir):
    generator = TransformersGenerator(model_dir, seed=3)
    completions = generator.generate(PROMPTS, SAMPLING)

    # TRL 1.16's GRPOTrainer, transformers path: these generation kwargs, left padding,
    # then everything after the first EOS cut (trl/trainer/grpo_trainer.py)
    model = load_llama(model_dir)
    config = transformers.GenerationConfig(
        max_new_tokens=SAMPLING.max_tokens,
        do_sample=True,
        pad_token_id=SAMPLING.pad_id,
        eos_token_id=list(SAMPLING.stop_ids),
        temperature=SAMPLING.temperature,
        top_p=SAMPLING.top_p,
        top_k=SAMPLING.top_k,
        min_p=None,
        repetition_penalty=1.0,
        disable_compile=True,
    )
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[SAMPLING.pad_id] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    torch.manual_seed(3)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    expected = []
    for row in out[:, width:].tolist():
        stops = [i for i, t in enumerate(row) if t in SAMPLING.stop_ids]
        expected.append(row[: stops[0] + 1] if stops else row)

    assert [c.ids for c in completions] == expected
    assert [c.truncated for c in completions] == [
        not any(t in SAMPLING.stop_ids for t in row) for row in expected
    ]
    assert {c.truncated for c in completions} == {True, False}  # both kinds are covered


def test_logps_equal_a_full_forward_at_the_temperature(model_dir):
    generator = TransformersGenerator(model_dir, seed=0)
    completions = generator.generate(PROMPTS, SAMPLING)
    model = load_llama(model_dir)
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        expected = full_forward_logps(model, prompt, completion.ids, SAMPLING.temperature)
        np.testing.assert_allclose(completion.logps, expected, rtol=0, atol=2e-5)
        # the raw distribution at the temperature, not the top-k/top-p filtered one
        # the token was drawn from (whose log-probabilities are larger)
        unscaled = full_forward_logps(model, prompt, completion.ids, 1.0)
        assert not np.allclose(completion.logps, unscaled, atol=1e-3)


def test_sampling_has_its_own_random_state(model_dir):
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    generator = TransformersGenerator(model_dir, seed=7)
    state = generator.state_dict()
    first = generator.generate(PROMPTS, SAMPLING)
    second = generator.generate(PROMPTS, SAMPLING)
    assert torch.equal(torch.get_rng_state(), before)  # the training's RNG is untouched
    assert [c.ids for c in first] != [c.ids for c in second]  # the state moves on

    again = TransformersGenerator(model_dir, seed=99)
    again.load_state_dict(state)
    assert [c.ids for c in again.generate(PROMPTS, SAMPLING)] == [c.ids for c in first]
    moved = generator.state_dict()
    resumed = TransformersGenerator(model_dir, seed=0)
    resumed.load_state_dict(moved)
    third = generator.generate(PROMPTS, SAMPLING)
    assert [c.ids for c in resumed.generate(PROMPTS, SAMPLING)] == [c.ids for c in third]
    assert [c.logps for c in resumed.generate(PROMPTS, SAMPLING)] == [
        c.logps for c in generator.generate(PROMPTS, SAMPLING)
    ]
    assert torch.equal(torch.get_rng_state(), before)


def test_weights_load_by_name_strictly_and_only_when_changed(model_dir, other_dir):
    generator = TransformersGenerator(model_dir, seed=0)
    other = load_llama(other_dir).state_dict()
    reference = TransformersGenerator(other_dir, seed=0)

    generator.load_weights(other, version=0)
    assert generator.version == 0 and generator.loads == 1
    assert [c.ids for c in generator.generate(PROMPTS, SAMPLING)] == [
        c.ids for c in reference.generate(PROMPTS, SAMPLING)
    ]
    # the same version again: nothing is copied (counted as skipped)
    own = load_llama(model_dir).state_dict()
    generator.load_weights(own, version=0)
    assert generator.skipped_loads == 1 and generator.loads == 1
    torch.testing.assert_close(
        generator.model.state_dict()["lm_head.weight"], other["lm_head.weight"], rtol=0, atol=0
    )
    # a new version, as NumPy arrays
    generator.load_weights({k: v.numpy() for k, v in own.items()}, version=1)
    torch.testing.assert_close(
        generator.model.state_dict()["lm_head.weight"], own["lm_head.weight"], rtol=0, atol=0
    )

    missing = dict(own)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(UsageError, match=r"missing 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        generator.load_weights(missing, version=2)
    with pytest.raises(UsageError, match=r"unexpected 'model\.extra\.weight'"):
        generator.load_weights({**own, "model.extra.weight": own["lm_head.weight"]}, version=2)
    wrong = {**own, "model.norm.weight": torch.ones(3)}
    with pytest.raises(UsageError, match=r"'model\.norm\.weight' has shape \(3,\)"):
        generator.load_weights(wrong, version=2)
    assert generator.version == 1


def test_tied_embeddings_load_without_the_tied_name(tmp_path):
    tied = save_tiny_llama(tmp_path / "tied", vocab_size=VOCAB, tie=True, seed=2)
    generator = TransformersGenerator(
        save_tiny_llama(tmp_path / "t0", vocab_size=VOCAB, tie=True), seed=0
    )
    weights = load_llama(tied).state_dict()
    weights.pop("lm_head.weight", None)
    generator.load_weights(weights, version=0)
    torch.testing.assert_close(
        generator.model.lm_head.weight, weights["model.embed_tokens.weight"], rtol=0, atol=0
    )


def test_a_config_only_directory_builds_the_model_and_leaves_the_rng(model_dir, tmp_path):
    config_only = tmp_path / "config"
    config_only.mkdir()
    (config_only / "config.json").write_text((model_dir / "config.json").read_text())
    torch.manual_seed(5)
    before = torch.get_rng_state()
    generator = TransformersGenerator(config_only, seed=0)
    assert torch.equal(torch.get_rng_state(), before)
    generator.load_weights(load_llama(model_dir).state_dict(), version=0)
    assert [c.ids for c in generator.generate(PROMPTS, SAMPLING)] == [
        c.ids for c in TransformersGenerator(model_dir, seed=0).generate(PROMPTS, SAMPLING)
    ]
    with pytest.raises(UsageError, match="no config.json"):
        TransformersGenerator(tmp_path, seed=0)


def test_reference_scorer_gives_the_sampling_logps_of_the_same_weights(model_dir):
    generator = TransformersGenerator(model_dir, seed=4)
    completions = generator.generate(PROMPTS, SAMPLING)
    records = [
        Rollout(
            step=1,
            index=i,
            prompt_index=i,
            prompt_ids=list(prompt),
            completion_ids=c.ids,
            completion="",
            rewards={},
            reward=0.0,
            advantage=0.0,
            logp_sum=sum(c.logps),
            truncated=c.truncated,
        )
        for i, (prompt, c) in enumerate(zip(PROMPTS, completions, strict=True))
    ]
    batch = RolloutBatch.build(records, [c.logps for c in completions], seq_len=20, pad_id=0)
    scorer = ReferenceScorer(model_dir, temperature=SAMPLING.temperature, micro_batch=3)
    ref = scorer.score(batch)
    assert ref.shape == (4, 20) and ref.dtype == np.float32
    np.testing.assert_allclose(ref, batch.values["old_logps"], rtol=0, atol=2e-5)
    assert (ref[~batch.completion_mask] == 0).all()


def test_a_reference_without_weights_is_refused(model_dir, tmp_path):
    config_only = tmp_path / "config"
    config_only.mkdir()
    (config_only / "config.json").write_text((model_dir / "config.json").read_text())
    with pytest.raises(UsageError, match=f"reference model {config_only} holds no weights"):
        ReferenceScorer(config_only)
    with pytest.raises(UsageError, match="holds no weights"):
        ReferenceScorer(tmp_path / "missing")
