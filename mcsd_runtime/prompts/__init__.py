"""Prompt sets: built-in domains, files and hub data sets."""
