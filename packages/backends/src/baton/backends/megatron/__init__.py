"""baton."""
