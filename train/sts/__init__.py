"""`mcsd train --decision sts`: DSpark's per-position confidence calibration (sequential
temperature scaling) for our verification budget and for SGLang's and TensorRT-LLM's
(`train.sts.trainer`)."""
