"""Benchmark the board or the host board, check the gate, print the S3 cost model.

    python tools/bench.py --port /dev/ttyACM0
    python tools/bench.py --board host [--image IMG] [--release-shaped]
    python tools/bench.py --gate --image IMG (--port PORT | --board host)
    python tools/bench.py --model-s3 [--release-shaped]

Thin wrapper around mpllm.board.bench (see its docstring for what is measured).
"""

if __name__ == "__main__":
    from _launch import launch

    launch("mpllm.board.bench_cli:main", "bench.py")
