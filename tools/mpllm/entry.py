"""The console scripts (pyproject.toml's [project.scripts]): each runs its
tool under mpllm.interrupt's Ctrl-C rules, which are in charge before the
tool's modules are imported. tools/*.py call mpllm.interrupt.run the same way.
(mpllm-chat is mpllm.board.chat's own: its Ctrl-C stops a story and goes on.)
"""

from __future__ import annotations

from typing import NoReturn

from .interrupt import run


def convert() -> NoReturn:
    run("mpllm.convert:main", "convert")


def flash() -> NoReturn:
    run("mpllm.board.flash:main", "flash")


def bench() -> NoReturn:
    run("mpllm.board.bench_cli:main", "bench")


def serve() -> NoReturn:
    run("mpllm.web.cli:main", "serve", repeat=True)  # (asyncio takes Ctrl-C)


def release() -> NoReturn:
    run("mpllm.board.release:main", "release")
