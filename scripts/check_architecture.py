"""The architecture rules' raw facts, read from the source with ``ast`` (nothing is imported or run).

``python3 scripts/check_architecture.py [ROOT]`` prints one line per breach (``CYCLE``,
``FILE``, ``FUNC``) and exits 1 if there is any. tests/test_architecture.py imports these
functions and enforces every rule of docs/architecture.md: this file is the one place the
import graph and the size limits are computed.

An import counts wherever it stands: module level, inside a function, under
``if TYPE_CHECKING``. ``from P import x`` is an import of module ``P.x`` when that module
exists, else of ``P`` itself (for a package: its ``__init__``, the aggregator). The implicit
import of a parent package's ``__init__`` that Python does for ``import P.m`` is not an edge.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("core", "train", "launch")
SIZE_DIRS = ("core", "train", "launch", "scripts", "tests")
MAX_FILE_LINES = 800  # a bound on sprawl, not a target: files divide where their code does
MAX_FUNCTION_LINES = 80
SOURCE_SUFFIXES = (".py", ".sh", ".j2")  # what the file-size limit covers (functions: .py only)
# Generated data, not written by hand: the launch goldens are whole rendered scripts/manifests.
EXCLUDED = ("tests/launch/golden/",)


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the packages (``P/__init__.py`` is ``P``)."""
    mods = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def import_statements(module: str, path: Path) -> list[tuple[str, list[str]]]:
    """``(base, members)`` per import: ``import a.b`` -> ``("a.b", [])``; ``from a import b, c``
    -> ``("a", ["b", "c"])``; relative imports made absolute."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            out.append((base, [alias.name for alias in node.names]))
    return out


def top_level_imports(module: str, path: Path) -> set[str]:
    """The first component of everything the module imports (``torch``, ``train``, ``os`` ...)."""
    return {base.split(".")[0] for base, _ in import_statements(module, path) if base}


def _resolve(name: str, mods) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the in-tree modules (of ``packages``) it imports."""
    mods = module_files(root, packages)
    graph = {}
    for module, path in mods.items():
        targets = set()
        for base, members in import_statements(module, path):
            names = [f"{base}.{m}" if f"{base}.{m}" in mods else base for m in members] or [base]
            targets.update(_resolve(name, mods) for name in names)
        graph[module] = {t for t in targets if t and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def source_files(root: Path, dirs=SIZE_DIRS, suffixes=(".py",), exclude=EXCLUDED) -> list[Path]:
    """The files ending in ``suffixes`` under ``dirs``, less those under an ``exclude`` prefix."""
    files = [p for d in dirs for p in sorted((root / d).rglob("*")) if p.is_file() and p.suffix in suffixes]
    return [p for p in files if not p.relative_to(root).as_posix().startswith(tuple(exclude))]


def long_files(files, limit: int = MAX_FILE_LINES) -> list[tuple[Path, int]]:
    """``(path, lines)`` of each file over ``limit`` lines."""
    counts = [(p, p.read_text().count("\n")) for p in files]
    return [(p, n) for p, n in counts if n > limit]


def long_functions(files, limit: int = MAX_FUNCTION_LINES) -> list[tuple[Path, str, int]]:
    """``(path, name, lines)`` of each function (nested ones too) over ``limit`` lines."""
    out = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append((path, node.name, lines))
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else ".")
    problems = [f"CYCLE {c}" for c in cycles(import_graph(root))]
    problems += [f"FILE {p} {n}" for p, n in long_files(source_files(root, suffixes=SOURCE_SUFFIXES))]
    problems += [f"FUNC {p} {name} {n}" for p, name, n in long_functions(source_files(root))]
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
