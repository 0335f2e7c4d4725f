"""What every module that builds or loads models shares: the device and dtype, whether bf16 pays
on this CPU, transformers' cache keyword across versions, a model's fingerprint, names of real
checkpoints and their GGUF conversion, and a draft cut from its target's layers. Below the
builders (`toy`, `distill`) and the pair loading above them (`models`)."""
