"""The reference: a training loop written directly against Megatron-Core (no baton in it).

The same model, optimizer, schedule and data as baton's Megatron backend builds for a
``Layout``; the per-step losses of both must agree. Data is either the byte indexed
dataset (``prefix``) or prepared data read through Megatron's own tokenizer and
``BlendedMegatronDatasetBuilder`` (``blend`` + ``tokenizer``). Used in-process by
test_megatron.py and under torchrun by worker.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

SEED = 1234


@dataclass(frozen=True)
class Layout:
    """A parallel layout and the model size it trains (parsed from names like ``tp2-sp-do``)."""

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    sp: bool = False
    distributed_optimizer: bool = False
    num_layers: int = 2
    micro_batch_size: int = 4
    global_batch_size: int = 8
    bpe: bool = False
    #: the model's vocabulary before padding (``v384``: the same padded size for TP 1 and 2)
    vocab_size: int | None = None
    #: MoE layers (``moe``): 4 experts, top 2, Megatron's aux loss; ``ep2``: expert parallel 2
    moe: bool = False
    ep: int = 1

    @classmethod
    def parse(cls, name: str) -> Layout:
        values: dict[str, Any] = {}
        for word in name.split("-"):
            if word in ("base", "plain", "dp"):
                continue
            if word.startswith("tp"):
                values["tp"] = int(word[2:])
            elif word == "moe":
                values["moe"] = True
            elif word.startswith("ep"):
                values.update(moe=True, ep=int(word[2:]))
            elif word.startswith("vpp"):
                values["vpp"] = int(word[3:])
                values["num_layers"] = 4
                values["micro_batch_size"] = 2
            elif word.startswith("pp"):
                values["pp"] = int(word[2:])
            elif word == "sp":
                values["sp"] = True
            elif word == "do":
                values["distributed_optimizer"] = True
            elif word == "bpe":
                values["bpe"] = True
            elif word.startswith("v") and word[1:].isdigit():
                values["vocab_size"] = int(word[1:])
            else:
                raise ValueError(f"unknown layout word {word!r} in {name!r}")
        return cls(**values)

    def transformer_config(self) -> Any:
        from baton.backends.megatron.config import tiny_transformer_config

        return tiny_transformer_config(
            num_layers=self.num_layers,
            tensor_model_parallel_size=self.tp,
            pipeline_model_parallel_size=self.pp,
            virtual_pipeline_model_parallel_size=self.vpp,
            sequence_parallel=self.sp,
            pipeline_dtype=torch.float32 if self.pp > 1 else None,
            **(self.experts() if self.moe else {}),
        )

    def experts(self) -> dict[str, Any]:
        """Megatron's MoE fields of the ``moe`` layouts (every layer sparse)."""
        return dict(
            num_moe_experts=4,
            moe_router_topk=2,
            moe_ffn_hidden_size=64,
            moe_aux_loss_coeff=0.01,
            moe_router_load_balancing_type="aux_loss",
            moe_token_dispatcher_type="allgather",
            expert_model_parallel_size=self.ep,
        )


def plain_loop(
    layout: Layout,
    steps: int,
    *,
    prefix: str | None = None,
    blend: tuple[list[str], list[float] | None] | None = None,
    tokenizer: str | None = None,
    train_samples: int | None = None,
) -> list[float]:
    """Per-step token-mean losses (every rank gets them) of a plain Megatron-Core loop."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tokenizers import MegatronTokenizer

    from baton.backends.megatron import cpu
    from baton.backends.megatron.data import ByteEodTokenizer
    from baton.core.patches import PatchRecorder

    recorder = PatchRecorder()
    if not torch.cuda.is_available():
        cpu.install_all(recorder)
    owns_group = not dist.is_initialized()
    if owns_group:
        store = Path(prefix or blend[0][0]).parent / "plain-store"  # type: ignore[index]
        store.unlink(missing_ok=True)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(
            layout.tp,
            layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp,
            expert_model_parallel_size=layout.ep,
        )
        torch.manual_seed(SEED)
        tensor_parallel.model_parallel_cuda_manual_seed(SEED)
        config = layout.transformer_config()
        if tokenizer is not None:
            tok = MegatronTokenizer.from_pretrained(
                tokenizer_path=tokenizer,
                metadata_path={"library": "huggingface", "model_type": "gpt"},
            )
            vocab = tok.vocab_size
        else:
            tok = ByteEodTokenizer()
            vocab = tok.vocab_size
        multiple = 64 * layout.tp
        padded = -(-vocab // multiple) * multiple
        chunks = []
        stages = list(range(layout.vpp)) if layout.vpp else [None]
        for stage in stages:
            model = GPTModel(
                config=config,
                transformer_layer_spec=get_gpt_layer_local_spec(
                    num_experts=config.num_moe_experts, moe_grouped_gemm=False
                ),
                vocab_size=padded,
                max_sequence_length=64,
                pre_process=parallel_state.is_pipeline_first_stage(False, stage),
                post_process=parallel_state.is_pipeline_last_stage(False, stage),
                share_embeddings_and_output_weights=True,
                vp_stage=stage,
            )
            ddp = DistributedDataParallelConfig(
                use_distributed_optimizer=layout.distributed_optimizer
            )
            chunks.append(
                DistributedDataParallel(config, ddp, model, disable_bucketing=bool(stage))
            )
        optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=1e-3,
                min_lr=1e-4,
                weight_decay=0.1,
                adam_beta1=0.9,
                adam_beta2=0.95,
                clip_grad=1.0,
                use_distributed_optimizer=layout.distributed_optimizer,
            ),
            chunks,
        )
        # baton's schedule of warmup 3, cosine to 1e-4 at step 20 (update k at lr(k):
        # 1e-3 * k / 3 while warming) in Megatron's terms, where update k is computed at
        # num_steps k - 1: warmup 2 from 1e-3 / 3, the decay ending at num_steps 19
        scheduler = OptimizerParamScheduler(
            optimizer,
            init_lr=1e-3 / 3,
            max_lr=1e-3,
            min_lr=1e-4,
            lr_warmup_steps=2,
            lr_decay_steps=19,
            lr_decay_style="cosine",
            start_wd=0.1,
            end_wd=0.1,
            wd_incr_steps=1,
            wd_incr_style="constant",
        )
        dp_rank = parallel_state.get_data_parallel_rank()
        dp_size = parallel_state.get_data_parallel_world_size()
        sizes: list[int | None] = [None, None, None]
        if train_samples is not None:
            eval_samples = 4 * layout.micro_batch_size * dp_size  # as the backend sizes it
            sizes = [train_samples, eval_samples, eval_samples]
        train = BlendedMegatronDatasetBuilder(
            GPTDataset,
            sizes,
            lambda: True,
            GPTDatasetConfig(
                random_seed=SEED,
                sequence_length=64,
                blend=blend or ([prefix], None),
                split="98,2,0" if tokenizer else "969,30,1",  # the backend's defaults
                tokenizer=tok,
                reset_position_ids=False,
                reset_attention_mask=False,
                eod_mask_loss=False,
                create_attention_mask=False,
                path_to_cache=None,
            ),
        ).build()[0]
        mbs = layout.micro_batch_size
        num_micro = layout.global_batch_size // (mbs * dp_size)

        def batches():  # Megatron's pretraining order: consecutive samples, rank slices
            index = 0
            while True:
                start = index + dp_rank * mbs
                samples = [train[(start + i) % len(train)] for i in range(mbs)]
                index += mbs * dp_size
                yield {k: torch.stack([torch.as_tensor(s[k]) for s in samples]) for k in samples[0]}

        def loss_func(loss_mask, output):
            losses = output.float().view(-1) * loss_mask.view(-1).float()
            count = loss_mask.sum().to(torch.int)
            return losses.sum(), count, {"lm": torch.stack([losses.sum().detach(), count.float()])}

        def forward_step(iterator, model):
            b = next(iterator)
            out = model(b["tokens"], b["position_ids"], None, labels=b["labels"])
            return out, partial(loss_func, b["loss_mask"])

        iterators = [batches() for _ in chunks]
        result = []
        for _ in range(steps):
            for chunk in chunks:
                chunk.zero_grad_buffer()
            optimizer.zero_grad()
            reduced = get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iterators if len(chunks) > 1 else iterators[0],
                model=chunks,
                num_microbatches=num_micro,
                seq_length=64,
                micro_batch_size=mbs,
                decoder_seq_length=64,
                forward_only=False,
            )
            finalize_model_grads(chunks)
            ok, _, _ = optimizer.step()
            assert ok
            scheduler.step(increment=1)
            pair = torch.stack([r["lm"] for r in reduced]).sum(0) if reduced else torch.zeros(2)
            if layout.pp > 1:
                dist.all_reduce(pair, group=parallel_state.get_pipeline_model_parallel_group())
            if dp_size > 1:
                dist.all_reduce(pair, group=parallel_state.get_data_parallel_group())
            result.append((pair[0] / pair[1]).item())
        return result
    finally:
        parallel_state.destroy_model_parallel()
        if owns_group:
            dist.destroy_process_group()
        recorder.undo()
