"""The web chat: write a story together with the model in a browser.

    python tools/serve.py --board host          # then open http://127.0.0.1:8000/
    python tools/serve.py --port /dev/ttyACM0   # a board over USB serial
    python tools/serve.py --board host --load-test

Thin wrapper around mpllm.web.cli (also installed as `mpllm-serve`).
"""

if __name__ == "__main__":
    from _launch import launch

    launch("mpllm.web.cli:main", "serve.py", repeat=True)  # (asyncio takes Ctrl-C)
