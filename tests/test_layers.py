"""The package's layers, from its source: no import cycle between modules (imports inside
functions count; `if TYPE_CHECKING:` imports do not, they never run), nothing below the command
line imports it, and `import bubo` (the library) loads neither the server's gevent nor Flask."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

BUBO = Path(__file__).resolve().parent.parent / "bubo"


def _modules() -> dict[str, Path]:
    """Every module's dotted name -> its source (native modules by their .pyi stubs)."""
    out: dict[str, Path] = {}
    for path in BUBO.rglob("*.py"):
        parts = path.relative_to(BUBO.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    for stub in BUBO.glob("*.pyi"):
        out[f"bubo.{stub.stem}"] = stub
    return out


def _type_only(tree: ast.AST) -> set[int]:
    """The nodes under `if TYPE_CHECKING:`."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                out.update(id(n) for n in ast.walk(stmt))
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the bubo modules it imports, anywhere in its source."""
    mods = _modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_only(tree)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from pkg import sub` imports the module pkg.sub; `from mod import name`, mod
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for n in names:
                if n == "bubo" or n.startswith("bubo."):
                    dep = known(n)
                    if dep is not None and dep != mod:
                        deps.add(dep)
        # importing a module runs its packages' __init__ first: those are imports too, but for
        # the packages the importer is itself inside (they are being imported already)
        own = {mod.rsplit(".", i)[0] for i in range(mod.count(".") + 1)}
        for dep in list(deps):
            parts = dep.split(".")
            deps.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                        if p in mods and p not in own)
        graph[mod] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    # bubo/cli/__init__.py imports its commands by name; bubo/api/about.py imports the chat page in
    # a function: both are edges
    assert "bubo.cli.flags" in graph["bubo.cli"]
    assert "bubo.webui" in graph["bubo.api.about"]
    assert "bubo.engine.memory" in graph["bubo.llm"]


def test_no_import_cycles():
    cycles = _cycles(import_graph())
    detail = [" <-> ".join(c) for c in cycles]
    assert not cycles, f"import cycles: {detail}"


def test_nothing_below_the_command_line_imports_it():
    graph = import_graph()
    top = {"bubo.__main__"}  # `python -m bubo`: the command line itself
    below = {m: deps for m, deps in graph.items()
             if m not in top and m != "bubo.cli" and not m.startswith("bubo.cli.")}
    users = sorted(m for m, deps in below.items() if any(d == "bubo.cli" or d.startswith("bubo.cli.") for d in deps))
    assert not users, f"modules under the command line that import it: {users}"


def test_the_library_does_not_load_the_server():
    code = ("import sys, bubo\n"
            "m = bubo.Model\n"
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'gevent', 'flask', 'werkzeug'}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert out.strip() == "[]", f"import bubo loaded {out.strip()}"
