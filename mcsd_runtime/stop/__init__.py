"""Stoppers: the contract, the built-in policies, the feature schema, learned models and
their artifacts."""
