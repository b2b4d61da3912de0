"""The accountings: the ZeRO paper's, the implementation's, DeepSpeed's estimator, the realistic peak and Megatron-Core's, as rows."""
