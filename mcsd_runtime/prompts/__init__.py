"""Prompt sets (built-in domains, instruction sets by category, benchmarks, files) and how a
prompt reaches the model (`chat`: raw or in the chat template)."""
