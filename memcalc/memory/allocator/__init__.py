"""The CUDA caching allocator: rounding, reserved memory, the context and NCCL, replayed."""
