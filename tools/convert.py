"""Convert a model and its tokenizer into an mpllm model image: an esp32-ai
model.bin with its tokenizer.json, or a llama2.c checkpoint with llama2.c's
tokenizer.bin.

    python tools/convert.py MODEL.bin TOKENIZER.json -o OUT.img
    python tools/convert.py MODEL.bin TOKENIZER.bin -o OUT.img      (a llama2.c checkpoint)

Thin wrapper around mpllm.convert (also installed as `mpllm-convert`).
"""

if __name__ == "__main__":
    from _launch import launch

    launch("mpllm.convert:main", "convert.py")
