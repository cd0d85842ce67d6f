"""The package's layout (DESIGN.md, "Layers"): no import cycle among specdec_cuda's modules, and the
wheel holds none of the project's own demo models or bench harness.

Imports are read from the source (``ast``), so these tests need no build. Every ``import`` and
``from ... import`` counts, at module level and inside functions alike; imports under
``if TYPE_CHECKING:`` are left out (they never run). A package's ``__init__`` running before its
submodules is not an edge: only imports written in a module are. Run this file as a script to
print the import graph's cycles.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "specdec_cuda"
ROOT = Path(__file__).resolve().parents[1] / "python" / PACKAGE
OUTSIDE = ("zoo", "bench")  # the repository's folders that the wheel must not import
EXTENSIONS = {f"{PACKAGE}._C"}  # compiled, so not in the walk (and not there before a build)


def modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Import statements anywhere in ``tree`` (functions included), except under TYPE_CHECKING."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_names(name: str, path: Path) -> set[str]:
    """The absolute names of the modules ``name`` imports (what a ``from X import a`` names: ``X.a``
    when that is a module, else ``X``)."""
    known = modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
            full = f"{base}.{alias.name}"
            out.add(full if full in known or full in EXTENSIONS else base)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    known = modules()
    return {name: {m for m in imported_names(name, path) if m in known and m != name}
            for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50 and "specdec_cuda.decoding" in graph, "the module walk found the package"
    assert "specdec_cuda.contract" in graph["specdec_cuda.decoding"], "edges resolve relative imports"
    found = cycles(graph)
    assert not found, "import cycles among specdec_cuda modules:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_loop_contract_is_a_leaf():
    # contract.py imports torch and the standard library only (TYPE_CHECKING-only names aside).
    assert import_graph()["specdec_cuda.contract"] == set()


def _imports_by_string(tree: ast.AST) -> set[str]:
    """Names passed as string literals to importlib.import_module / __import__."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.add(node.args[0].value)
    return out


# The command line's demo and bench run from a source checkout by design: __main__ imports the
# checkout's bench.e2e (and zoo) only after checking that the checkout is there, and says so from
# a wheel. No other module may.
CHECKOUT_COMMANDS = {"specdec_cuda.__main__"}


def test_no_module_of_the_package_imports_zoo_or_bench():
    bad = []
    for name, path in modules().items():
        if name in CHECKOUT_COMMANDS:
            continue
        tree = ast.parse(path.read_text(), str(path))
        names = imported_names(name, path) | _imports_by_string(tree)
        bad += [f"{name} imports {m}" for m in sorted(names) if m.split(".")[0] in OUTSIDE]
    assert not bad, "\n".join(bad)


def test_no_zoo_or_e2e_file_in_the_package():
    bad = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if p.name.startswith("zoo") or p.name == "e2e.py"]
    assert not bad, f"the demo models and the e2e harness live in zoo/ and bench/, not in the wheel: {bad}"


if __name__ == "__main__":
    found = cycles(import_graph())
    print("\n".join(" <-> ".join(c) for c in found) if found else "no import cycle")
