"""The house rules of docs/ARCHITECTURE.md, checked on the code's own imports (ast, no third-party
tool): no import circle between modules, and each package imports only the packages below it.
`python tests/test_architecture.py` prints the package graph and every module-level arrow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "microbench"

# Each package and what it may import besides itself, lowest first (docs/ARCHITECTURE.md, "Layers").
# `cli` is cli.py and __main__.py; `root` is microbench/__init__.py.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "results": {"core"},
    "expect": {"core"},
    "compose": {"core", "results"},
    "targets": {"core", "results"},
    "world": {"core", "results", "targets"},
    "run": {"core", "results", "targets", "world", "expect"},
    "probes": {"core", "results", "targets", "world", "run", "expect", "compose"},
    "lab": {"core", "results", "targets", "world", "run", "expect", "probes"},
    "verify": {"core", "results", "targets", "world", "run", "expect", "compose", "probes", "lab"},
    "accept": {"core", "results", "targets", "world", "run", "expect", "compose", "probes", "lab", "verify"},
    "commands": {"core", "results", "targets", "world", "run", "expect", "compose", "probes", "lab", "verify",
                 "accept"},
    "cli": {"core", "results", "targets", "world", "run", "expect", "compose", "probes", "lab", "verify",
            "accept", "commands"},
}
for _name, _allowed in ALLOWED.items():
    if _name != "core":
        _allowed.add("root")   # microbench/__init__.py: __version__ and the error classes
ALLOWED["root"] = {"core"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def package_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if parts[1] in ("cli", "__main__"):
        return "cli"
    return parts[1]


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The microbench modules `module` imports, at any depth of its code (an import inside a
    function is still an arrow: it runs whenever that function does)."""
    out: set[str] = set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("microbench"):
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                out.add(full if full in known else source)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("microbench") and a.name in known}
    out.discard(module)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def broken_rules(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            a, b = package_of(src), package_of(dst)
            if a != b and b not in ALLOWED[a]:
                out.append(f"{src} -> {dst} ({a} may not import {b})")
    return out


@pytest.mark.slow
def test_no_import_circle():
    assert cycles(graph()) == []


@pytest.mark.slow
def test_every_package_imports_only_what_lies_below_it():
    assert set(package_of(m) for m in modules()) <= set(ALLOWED), "a package the rules do not name"
    assert broken_rules(graph()) == []


def test_package_rules_form_layers():
    # The rules themselves have no circle: a package's allowed set never reaches back to it.
    assert cycles(ALLOWED) == []


@pytest.mark.slow
@pytest.mark.parametrize("what", ["microbench.compose", "microbench.results", "microbench.core",
                                  "microbench.core.registry", "microbench.expect"])
def test_the_base_loads_without_torch_or_any_probe(what):
    """The composer and the record schema are pure: loading them loads no probe, no world code
    and no torch (a fresh interpreter, so nothing else imported them first)."""
    code = (f"import sys, {what}, microbench.compose.inputs, microbench.results.store\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'microbench.probes',"
            " 'microbench.world', 'microbench.run', 'microbench.lab')))\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).parent))
    assert out.stdout.strip() == ""


def test_no_module_over_400_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}


def test_commands_stay_thin():
    total = sum(len(p.read_text().splitlines()) for p in (SRC / "commands").glob("*.py"))
    assert total <= 1500, f"commands/ holds {total} lines; library logic belongs in its package"


def defined_names(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
                elif isinstance(sub, ast.Assign):
                    names |= {n.id for t in sub.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


@pytest.mark.slow
def test_every_import_of_microbench_resolves():
    """Every `from microbench... import name`, at any depth (an import inside a function runs
    only when that function does, so a stale one hides until then), names a module that exists
    and a name it defines."""
    mods = modules()
    wrong = []
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("microbench") or source == "microbench._native":
                continue
            if source not in mods:
                wrong.append(f"{module}:{node.lineno} imports missing module {source}")
                continue
            names = defined_names(mods[source])
            for alias in node.names:
                if f"{source}.{alias.name}" not in mods and alias.name not in names and alias.name != "*":
                    wrong.append(f"{module}:{node.lineno} imports {alias.name!r}, which {source} does not define")
    assert wrong == []


if __name__ == "__main__":
    edges = graph()
    packages: dict[tuple[str, str], int] = {}
    for src, targets in edges.items():
        for dst in targets:
            key = (package_of(src), package_of(dst))
            if key[0] != key[1]:
                packages[key] = packages.get(key, 0) + 1
    for (a, b), n in sorted(packages.items()):
        print(f"{a:9} -> {b:9} {n}")
    print("circles:", cycles(edges) or "none")
    print("\n".join(broken_rules(edges)) or "rules: kept")
