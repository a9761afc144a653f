"""House style is a test: ruff (settings in pyproject.toml) over every Python file in the repo,
and the rules ruff has no setting for (below)."""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

import cbuild
import setup_dev
from conftest import need_tool

TOOLS = cbuild.ROOT / "tools"


def test_ruff_clean() -> None:
    ruff = need_tool(lambda: setup_dev.console_script("ruff"))
    result = subprocess.run([ruff, "check", "--output-format", "concise", "."], check=False,
                            cwd=cbuild.ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _module_names(root: Path) -> dict[str, Path]:
    """Every module below `root` by its import name (tools/ is on sys.path: `mpllm.board.bench`)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` as a string, or None when the expression is not a plain dotted name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def private_uses(source: str, module: str, modules: set[str]) -> Iterator[str]:
    """The private names of other modules in `modules` that `source` (module `module`) uses:
    `from m import _x`, and `m._x` where m is bound by an import to one of them."""
    tree = ast.parse(source)
    # what a relative import is relative to: a package's __init__ is the package itself
    package = module.split(".") if _is_package(module, modules) else module.split(".")[:-1]
    bound: dict[str, str] = {}  # local name -> module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source_module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{source_module}.{alias.name}"
                if full in modules:
                    bound[alias.asname or alias.name] = full
                elif source_module in modules and source_module != module and _is_private(alias.name):
                    yield f"line {node.lineno}: from {source_module} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules or any(m.startswith(alias.name + ".") for m in modules):
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:  # `import a.b` binds `a`; `a.b` is then reached by attribute
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            dotted = _dotted(node.value)
            if dotted is None:
                continue
            head, _, rest = dotted.partition(".")
            if head not in bound:
                continue
            target = bound[head] + ("." + rest if rest else "")
            if target in modules and target != module:
                yield f"line {node.lineno}: {target}.{node.attr}"


def _is_package(module: str, modules: set[str]) -> bool:
    return any(m.startswith(module + ".") for m in modules)


def test_no_private_names_across_modules_in_tools() -> None:
    """A name with a leading underscore is its module's own: another module of tools/ that
    needs it wants it public (renamed, every user with it), not reached into."""
    modules = _module_names(TOOLS)
    found = [f"{path.relative_to(cbuild.ROOT)} {use}"
             for name, path in sorted(modules.items())
             for use in private_uses(path.read_text(encoding="utf-8"), name, set(modules))]
    assert not found, "private names used across modules in tools/:\n" + "\n".join(found)


def test_private_uses_finds_each_form() -> None:
    """The check above sees each way of reaching another module's private name, and
    leaves a module's own and a dunder alone."""
    modules = {"mpllm", "mpllm.a", "mpllm.b", "mpllm.pkg", "mpllm.pkg.c"}
    src = (
        "from mpllm.a import _x, y\n"        # absolute
        "from . import a\n"                  # a module bound by a relative import
        "from .pkg.c import _z\n"            # relative
        "import mpllm.a\n"
        "import mpllm.pkg.c as c\n"
        "a._p; mpllm.a._q; c._r\n"           # attributes of bound modules
        "self._ok; a.__doc__; _local = 1\n"  # not another module's private name
    )
    assert list(private_uses(src, "mpllm.b", modules)) == [
        "line 1: from mpllm.a import _x", "line 3: from mpllm.pkg.c import _z",
        "line 6: mpllm.a._p", "line 6: mpllm.a._q", "line 6: mpllm.pkg.c._r"]
    assert list(private_uses("from .. import _top\n", "mpllm.pkg.c", modules)) == [
        "line 1: from mpllm import _top"]
    assert list(private_uses("from . import _own\n", "mpllm.pkg", modules)) == []
    assert list(private_uses("from mpllm.b import _mine\n", "mpllm.b", modules)) == []



def imported_modules(source: str) -> set[str]:
    """The modules `source` imports by absolute name, anywhere in it (a function's own
    imports too): `import a.b` and `from a.b import c` both give a.b."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/helpers (imported by name) and fixtures in
    conftest.py: a test module imported by another would run its setup there and tie
    the two files together (moving one breaks the other)."""
    tests = cbuild.ROOT / "tests"
    test_modules = {p.stem for p in tests.rglob("test_*.py")}
    found = [f"{path.relative_to(cbuild.ROOT)} imports {name}"
             for path in sorted(tests.rglob("*.py"))
             for name in sorted(imported_modules(path.read_text(encoding="utf-8")))
             if name.split(".")[0] in test_modules]
    assert not found, "\n".join(found)


def test_imported_modules_sees_each_form() -> None:
    src = "import a.b\nfrom c import d\nfrom . import e\ndef f():\n    import test_g as h\n"
    assert imported_modules(src) == {"a.b", "c", "test_g"}


def round_ups(source: str) -> list[int]:
    """Lines of `source` that round up to a multiple by hand: `-(-n // a) * a` or
    `(n + a - 1) // a * a` (either order of the product)."""
    def same(a: ast.expr, b: ast.expr) -> bool:
        return ast.dump(a) == ast.dump(b)

    def ceil_div(e: ast.expr) -> ast.expr | None:
        """The divisor of `-(-n // a)` or `(n + a - 1) // a`, else None."""
        if (isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub)
                and isinstance(e.operand, ast.BinOp) and isinstance(e.operand.op, ast.FloorDiv)
                and isinstance(e.operand.left, ast.UnaryOp) and isinstance(e.operand.left.op, ast.USub)):
            return e.operand.right
        if (isinstance(e, ast.BinOp) and isinstance(e.op, ast.FloorDiv)
                and isinstance(e.left, ast.BinOp) and isinstance(e.left.op, ast.Sub)
                and isinstance(e.left.right, ast.Constant) and e.left.right.value == 1
                and isinstance(e.left.left, ast.BinOp) and isinstance(e.left.left.op, ast.Add)
                and same(e.left.left.right, e.right)):
            return e.right
        return None

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for div, mul in ((node.left, node.right), (node.right, node.left)):
                d = ceil_div(div)
                if d is not None and same(d, mul):
                    found.append(node.lineno)
    return found


def test_one_round_up_helper_in_tools() -> None:
    """tools/ rounds up to a multiple only through mpllm.formats.align.align_up (as native/
    does through llm_align_up): a second spelling is a second place to get it wrong."""
    helper = TOOLS / "mpllm" / "formats" / "align.py"
    found = [f"{path.relative_to(cbuild.ROOT)}:{line}"
             for path in sorted(TOOLS.rglob("*.py")) if path != helper
             for line in round_ups(path.read_text(encoding="utf-8"))]
    assert not found, "round up with align_up:\n" + "\n".join(found)


def test_round_ups_finds_each_spelling() -> None:
    src = ("a = -(-n // 16) * 16\nb = 32 * -(-cols // 32)\nc = (x + k - 1) // k * k\n"
           "d = -(-n // g)\ne = -(-n // 16) * 32\n")
    assert round_ups(src) == [1, 2, 3]
