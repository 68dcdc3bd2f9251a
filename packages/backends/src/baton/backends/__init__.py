"""baton.backends: one subpackage per training system; heavy imports stay inside each."""
