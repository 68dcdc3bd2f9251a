"""One model definition for every backend: the Hugging Face ``config.json`` read
once (``spec``), its mixture of experts (``moe``) and rotary scaling
(``rope_scaling``), and the quantities a parallel layout splits
(``parallel_layout``).
"""
