"""Serving engines (vLLM, TensorRT-LLM, SGLang): what the toolkit measures, reads and writes."""
