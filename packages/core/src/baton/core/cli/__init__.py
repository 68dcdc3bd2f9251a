"""The ``baton`` command and what recipes are made of: the command (``command``),
recipes and their flags (``recipe``, ``recipe_extension``, ``recipe_signature``), the
flag vocabulary (``vocabulary``), config files (``config_values``), callbacks from the
command line (``callback_flags``), ``--set`` overrides
(``overrides``), the console line (``console_line``) and ``--dry-run`` (``dry_run``).
"""
