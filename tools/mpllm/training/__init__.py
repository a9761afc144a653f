"""Models to test and to ship: the story corpus the demo model is trained on,
the training run itself (`train`, behind tools/train.py), and seeded random
models of any shape for the tests and golden sets."""
