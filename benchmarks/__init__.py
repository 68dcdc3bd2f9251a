"""baton benchmarks: scripts that print ratio tables (run ``benchmarks/run.py``)."""
