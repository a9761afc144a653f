"""A board's frozen manifest (firmware/boards/*/manifest.py), run the way
MicroPython's makemanifest.py runs it: the calls it makes, with our own
includes ($(BOARD_DIR)/...) followed and the port's recorded."""

from __future__ import annotations

from pathlib import Path


def manifest_calls(board_dir: Path, path: Path | None = None) -> list[tuple[str, str, str]]:
    """(kind, name or path, base_path) of every include() and module() call."""
    calls: list[tuple[str, str, str]] = []

    def include(p: str) -> None:
        calls.append(("include", p, ""))
        if p.startswith("$(BOARD_DIR)"):
            calls.extend(manifest_calls(board_dir, Path(p.replace("$(BOARD_DIR)", str(board_dir)))))

    env = {"include": include,
           "module": lambda name, base_path=".": calls.append(("module", name, base_path))}
    path = path or board_dir / "manifest.py"
    exec(compile(path.read_text(), str(path), "exec"), env)  # noqa: S102
    return calls


def frozen_modules(board_dir: Path) -> list[str]:
    """The module names the board's manifest freezes from firmware/modules."""
    modules = board_dir.parent.parent / "modules"
    return sorted(name for kind, name, base in manifest_calls(board_dir)
                  if kind == "module"
                  and Path(base.replace("$(BOARD_DIR)", str(board_dir))).resolve() == modules)
