"""The decoder inside other libraries' loops: `hf`, transformers' `custom_generate`."""
