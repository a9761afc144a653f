"""The numerics oracle: the engine's float32 operations mirrored in numpy
(numerics, sampler), the reference forward pass built on them, and its
PyTorch twin. Reads the formats; knows nothing of boards."""
