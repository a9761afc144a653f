"""The files: the model in memory, esp32-ai's model.bin, our model image and
its sections (head tiles, drafts, RoPE table, tokenizer), ESP-IDF's partition
table. Each module reads and writes one format and imports nothing above it."""
