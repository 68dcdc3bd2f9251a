"""``gpu_speed.py``'s ``hand-loop`` row: plain PyTorch and ``transformers`` over baton's
packed SFT rows, 1 row per micro-batch and ``rows`` accumulated, the model's own loss
(``labels``, ``position_ids`` restarting per document), AdamW, gradient clipping at 1.0.

Example::

    setting = Setting(Inputs(Path("/tmp/g"), TINY), "32-true", cuda=False)
    hand_loop(setting)
    # Measured(seconds_per_step=0.02, tokens=512, flops_per_token=..., paths=
    #          "attention=sdpa cross_entropy=transformers optimizer=AdamW")
"""

from __future__ import annotations

from typing import Any

from benchmarks.gpu_speed_measure import Measured, flops_per_token, hf_paths
from benchmarks.gpu_speed_setting import LR, Setting, load_qwen3


def hand_loop(setting: Setting) -> Measured:
    import torch

    from baton.data.packed import PackedDataset

    shape, window, inputs = setting.shape, setting.window(), setting.inputs
    device = torch.device(setting.accelerator)
    model: Any = load_qwen3(inputs).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    data = PackedDataset(inputs.sft()[0])
    pad = int(inputs.hf_tokenizer.pad_token_id)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=setting.bf16)
    for step in range(1, shape.steps + 1):
        window.begin(step - 1)
        rows = [((step - 1) * shape.rows + i) % data.num_rows for i in range(shape.rows)]
        batch = data.batch(rows, pad_id=pad)
        tokens = torch.from_numpy(batch.inputs).to(device, non_blocking=True)
        positions = torch.from_numpy(batch.positions).long().to(device)
        targets = torch.from_numpy(batch.targets)
        labels = targets.masked_fill(~torch.from_numpy(batch.loss_mask), -100)
        labels = labels.to(device)
        supervised = batch.supervised_tokens
        for i in range(shape.rows):  # 1 row per micro-batch, all accumulated
            with autocast:
                loss = model(
                    input_ids=tokens[i : i + 1], position_ids=positions[i : i + 1],
                    labels=labels[i : i + 1], shift_labels=labels[i : i + 1],
                    num_items_in_batch=supervised,
                ).loss  # fmt: skip
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window.end(step)
    paths = hf_paths(model, cross_entropy="transformers", optimizer="AdamW")
    flops = flops_per_token(shape.qwen3, inputs.qwen3(), shape.seq_len)
    return Measured(window.per_step(), shape.step_tokens, flops, paths)
