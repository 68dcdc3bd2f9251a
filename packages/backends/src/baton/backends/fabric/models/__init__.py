"""Built-in models the recipes train through Fabric (the quickstart's small GPT).

They are not part of the backend: a recipe hands them to ``FabricBackend`` like any
user's own model and data, and the backend knows nothing about them.

Example::

    from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
    backend = GPTTraining(model=GPTConfig(n_layer=2), batch_size=8).backend()
"""
