"""Frameworks as overlays on the step: FSDP1/FSDP2/HSDP, tensor parallelism, DeepSpeed ZeRO, pipeline stages, offload."""
