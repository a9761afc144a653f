"""The numerics oracle: the engine's float32 operations mirrored in numpy
(numerics, sampler), the reference forward pass built on them, and its
PyTorch twin; and llama2.c's Llama by token ids (llama2c), not the engine's
numerics, to measure drafting on a real trained model. Reads the formats;
knows nothing of boards."""
