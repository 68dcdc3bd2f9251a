"""A run on disk: its checkpoints' files (``files``), saving and resuming
(``saving``, ``resuming``, ``manager``), whether a checkpoint can continue this run
(``compatibility``), the protocol of a backend's checkpoint part (``io``), what a
resume may change (``settings``), copies kept elsewhere (``remote``), array files
(``array_files``), the run directory's lock (``rundir``) and ``run.json``
(``run_record``). The facts a backend reports and the load plan it returns are
part of the backend contract: ``baton.core.checkpoint_record``.
"""
