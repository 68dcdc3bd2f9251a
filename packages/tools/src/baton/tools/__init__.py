"""baton.tools: commands that are tools, not training (``baton plot``, ``baton data``, ...).

Each command lives in its own module with a ``main(argv) -> int``; ``baton.core.cli.command``
imports it only when that command runs.
"""
