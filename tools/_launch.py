"""How the commands tools/*.py start (not a command itself): `launch` imports
mpllm.interrupt and hands it the tool.

`python tools/X.py` puts tools/ first on sys.path, so this module and the mpllm
it imports are the checkout's, installed or not, from any working directory.
Ctrl-C is one line from here on, the imports included: mpllm.interrupt's run
once it is in charge, and before it is, the except below.
"""

from __future__ import annotations

import sys


def launch(target: str, prog: str, *, repeat: bool = False) -> None:
    """Run `target` ("package.module:function") as the command `prog` under
    mpllm.interrupt.run (`repeat` as there); exits, never returns."""
    try:
        from mpllm.interrupt import run
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    run(target, prog, repeat=repeat)
