"""Benchmark the board or the host board, check the gate, print the S3 cost model.

    python tools/bench.py --port /dev/ttyACM0
    python tools/bench.py --board host [--image IMG] [--release-shaped]
    python tools/bench.py --gate --image IMG (--port PORT | --board host)
    python tools/bench.py --model-s3 [--release-shaped]

Thin wrapper around mpllm.board.bench (see its docstring for what is measured).
"""

from __future__ import annotations

import sys

# `python tools/bench.py` puts tools/ first on sys.path, so this is the checkout's
# mpllm, installed or not. Ctrl-C is one line from here on, the imports
# included (mpllm.interrupt; before it is in charge, the except below).
try:
    from mpllm.interrupt import run
except KeyboardInterrupt:
    print("bench.py: interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    run("mpllm.board.bench_cli:main", "bench.py")
