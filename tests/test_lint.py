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


# ---- the import graph: no circles, and the cost model an add-on ------------------

BOARD_PY = cbuild.ROOT / "firmware" / "modules"


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """Who imports whom among `modules` (name -> path), each edge with the line of its
    first import: every import statement, at module level or inside a function (a
    lazy import is still an arrow a reader follows), `from p import m` to the module
    p.m when there is one, else to p. A package's __init__ is its own module; importing
    p.m is an arrow to p.m alone."""
    names = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        package = module.split(".") if _is_package(module, names) else module.split(".")[:-1]
        edges: dict[str, int] = {}

        def add(target: str, line: int, module: str = module, edges: dict[str, int] = edges) -> None:
            if target in names and target != module:
                edges.setdefault(target, line)

        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    if f"{source}.{alias.name}" in names:
                        add(f"{source}.{alias.name}", node.lineno)
                    else:
                        add(source, node.lineno)
        graph[module] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _house_modules() -> dict[str, Path]:
    """The Python of tools/ (by import name; the commands tools/*.py as `tools.X`, no
    module imports them) and of the board (firmware/modules, by file name)."""
    mods = {("tools." + k if "." not in k and k != "mpllm" else k): p
            for k, p in _module_names(TOOLS).items()}
    mods.update({p.stem: p for p in BOARD_PY.glob("*.py")})
    return mods


def test_no_import_circle_in_tools_and_the_board() -> None:
    """Imports point one way (docs/ARCHITECTURE.md's order): no two modules of tools/ or
    firmware/modules reach each other, lazily or not."""
    graph = import_graph(_house_modules())
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_import_graph_sees_each_form_and_finds_a_circle(tmp_path: Path) -> None:
    files = {"p/__init__.py": "", "p/a.py": "from . import b\n",
             "p/b.py": "def f():\n    from .c import g\n", "p/c.py": "import p.a\n",
             "p/d.py": "from p.c import g\n", "top.py": "import p.d\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = import_graph(_module_names(tmp_path))
    assert graph["p.a"] == {"p.b": 1} and graph["p.b"] == {"p.c": 2}
    assert graph["p.d"] == {"p.c": 1} and graph["top"] == {"p.d": 1}
    assert circles(graph) == [["p.a", "p.b", "p.c"]]


#: The cost model's lazy entry: `bench.py --model-s3` (and its shape reports and
#: --refit) is the cost model's own command, reached from the bench's command line,
#: which also hands --ab's report the cost model's overlap fit (bench_cli._costmodel).
COSTMODEL_ENTRY = {"mpllm.board.bench_cli"}
#: What still imports the cost model in the product, to be made data or moved
#: (issue #36 part 1): this list only shrinks.
COSTMODEL_NOT_YET: set[str] = set()  # (convert and flash.py read the engine's plan now)


def costmodel_importers() -> dict[str, int]:
    """The modules outside tools/mpllm/costmodel that import it, with a line."""
    graph = import_graph(_house_modules())
    inside = lambda m: m == "mpllm.costmodel" or m.startswith("mpllm.costmodel.")
    return {m: min(line for t, line in edges.items() if inside(t))
            for m, edges in sorted(graph.items())
            if not inside(m) and any(inside(t) for t in edges)}


def test_nothing_in_the_product_imports_the_cost_model() -> None:
    """The cost model is an add-on: what the product needs of it is data with a version
    (tools/mpllm/draft_prices.json) and board facts in a basic module; only the bench's
    --model-s3 entry reaches it, lazily (inside the function that runs it)."""
    found = costmodel_importers()
    extra = sorted(set(found) - COSTMODEL_ENTRY - COSTMODEL_NOT_YET)
    assert not extra, "\n".join(f"{m} line {found[m]} imports the cost model" for m in extra)
    gone = sorted(COSTMODEL_NOT_YET - set(found))
    assert not gone, f"no longer imports the cost model: drop from COSTMODEL_NOT_YET: {gone}"
    for m in (COSTMODEL_ENTRY - COSTMODEL_NOT_YET) & set(found):  # lazily: not at module level
        tree = ast.parse(_house_modules()[m].read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
               and "costmodel" in ast.unparse(n)]
        assert not top, f"{m}: the cost model imported at module level: {ast.unparse(top[0])}"
        every = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 and "costmodel" in ast.unparse(n)]
        assert len(every) == 1, f"{m}: one lazy import of the cost model, not at lines {every}"


# ---- the import graph follows docs/ARCHITECTURE.md's order ----------------------

#: docs/ARCHITECTURE.md section 6, "Host tools": its list, in order, each item a
#: rank (a module is its longest listed prefix; the commands tools/*.py sit on
#: top). A module imports only its own item and the items above it.
LAYERS = (
    ("mpllm", "mpllm.checkout", "mpllm.atomic", "mpllm.boards", "mpllm.interrupt",
     "mpllm.entry"),
    ("mpllm.formats", "mpllm.quantize"),
    ("mpllm.reference",),
    ("mpllm.training",),
    ("mpllm.draft_prices", "mpllm.drafting", "mpllm.convert", "mpllm.llama2c_weights",
     "mpllm.models", "mpllm.image_cache"),
    ("mpllm.costmodel",),
    ("mpllm.board",),
    ("mpllm.web",),
    ("tools",),
)
#: Imports against the order still there (issue #36): none since convert's
#: where-each-format-lives table reads the engine's plan. This list only shrinks.
ORDER_NOT_YET: set[str] = set()


def layer_of(module: str) -> int | None:
    """The rank of `module` in LAYERS (its longest listed prefix), None if unlisted."""
    best: tuple[int, int] | None = None
    for rank, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (rank, len(p))
    return None if best is None else best[0]


def against_the_order(graph: dict[str, dict[str, int]]) -> dict[str, int]:
    """Every import (lazy ones too) of a module from an item below its own in
    LAYERS: "m imports t", with the line of m's first import of t."""
    return {f"{m} imports {t}": line
            for m, edges in sorted(graph.items()) for t, line in sorted(edges.items())
            if (a := layer_of(m)) is not None and (b := layer_of(t)) is not None and b > a}


def test_tools_modules_all_have_a_place_in_the_order() -> None:
    """A new module of tools/ finds its item in ARCHITECTURE.md's list (and here) first."""
    unlisted = sorted(m for m in _house_modules()
                      if m.startswith(("mpllm", "tools.")) and layer_of(m) is None)
    assert not unlisted, f"not in docs/ARCHITECTURE.md's order (LAYERS): {unlisted}"


def test_imports_follow_the_architecture_order() -> None:
    """Imports point up docs/ARCHITECTURE.md's list of tools/mpllm's parts: the
    files, the numerics oracle, training, the converter's item, the cost model,
    the board, the web chat, the commands. The cost model reads the boards from
    mpllm.boards, not mpllm.board."""
    found = against_the_order(import_graph(_house_modules()))
    extra = sorted(set(found) - ORDER_NOT_YET)
    assert not extra, "imports against docs/ARCHITECTURE.md's order:\n" + "\n".join(
        f"{e} (line {found[e]})" for e in extra)
    gone = sorted(ORDER_NOT_YET - set(found))
    assert not gone, f"no longer against the order: drop from ORDER_NOT_YET: {gone}"


def test_against_the_order_finds_an_upward_import() -> None:
    graph = {"mpllm.costmodel.llama": {"mpllm.board.firmware_pins": 47, "mpllm.boards": 48},
             "mpllm.board.bench": {"mpllm.formats.image": 3}, "mpllm.formats.x": {"tools.bench": 1}}
    assert against_the_order(graph) == {
        "mpllm.costmodel.llama imports mpllm.board.firmware_pins": 47,
        "mpllm.formats.x imports tools.bench": 1}
    assert layer_of("mpllm.boards") == 0 and layer_of("mpllm.board.flash") == 6
    assert layer_of("mpllm") == 0 and layer_of("llm_session") is None
