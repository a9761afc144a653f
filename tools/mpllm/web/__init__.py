"""The web chat (`tools/serve.py`, `mpllm-serve`): a page, a WebSocket API,
engine processes (or one board) behind a fair queue, and a load test."""
