"""Model pairs: loading a target and draft, and the `generate()` integration."""
