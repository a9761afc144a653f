"""Benchmark the board or the host board, check the gate, print the S3 cost model.

    python tools/bench.py --port /dev/ttyACM0
    python tools/bench.py --board host [--image IMG] [--release-shaped]
    python tools/bench.py --gate --image IMG (--port PORT | --board host)
    python tools/bench.py --model-s3 [--release-shaped]

Thin wrapper around mpllm.board.bench (see its docstring for what is measured).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from mpllm.board.bench_cli import main
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mpllm.board.bench_cli import main

if __name__ == "__main__":
    sys.exit(main())
