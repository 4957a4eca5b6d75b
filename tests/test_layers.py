"""The import graph of dtrlab: no module imports a higher layer (not even inside a function), no cycles.

Every module is parsed with ``ast``; every ``import`` and ``from ... import`` counts,
wherever it stands (module level, function, ``if TYPE_CHECKING``), and so does
``importlib.import_module`` with a literal name. The layers, lowest first, are those
of docs/architecture.md ("What is in the package"); a module may import its own layer or a lower
one. Top-level modules such as ``dtrlab/version.py`` are utilities below every layer
and import nothing of dtrlab; ``dtrlab/__init__.py`` is the façade above all of them,
and no module of dtrlab imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dtrlab"

#: Lowest first. ``execute`` runs a captured step under the runtime's decisions: it imports
#: the runtime and the trace layer, nothing above (placed below the sweep so that a sweep may
#: use it); ``calibrated`` holds policies that simulate to decide (``monotone``), so it sits
#: above the runtime and the sweep, whose cache it reads.
LAYERS = ["trace", "memory", "policies", "runtime", "execute", "sweep", "calibrated", "analysis", "solvers",
          "search", "plots", "widgets", "cli"]
UTILITY = -1  # a top-level module: below every layer
FACADE = len(LAYERS)  # dtrlab/__init__.py and dtrlab/__main__.py


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
#: The C extensions (dtrlab/runtime/_core.c -> dtrlab.runtime._core): leaves, importing nothing.
EXTENSIONS = {module_name(p) for p in PACKAGE.rglob("*.c")}


def layer(module: str) -> int:
    parts = module.split(".")
    if module in ("dtrlab", "dtrlab.__main__"):
        return FACADE
    if len(parts) == 2 and MODULES[module].name != "__init__.py":
        return UTILITY
    if parts[1] not in LAYERS:
        raise AssertionError(f"package dtrlab.{parts[1]} is in no layer: add it to LAYERS in tests/test_layers.py "
                             "and to the package map in docs/architecture.md, where it belongs")
    return LAYERS.index(parts[1])


def _resolve(name: str) -> str | None:
    """The dtrlab module an import of ``name`` executes last: the longest prefix that is a module."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES or candidate in EXTENSIONS:
            return candidate
    return None


def imports(module: str) -> list[tuple[int, str]]:
    """(line, imported dtrlab module), once per line and module, for every import in ``module``'s source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from pkg import sub` imports the submodule when there is one, else pkg itself.
            names = [f"{source}.{alias.name}" if _resolve(f"{source}.{alias.name}") == f"{source}.{alias.name}"
                     else source for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            name = node.args[0].value
            if name.startswith("."):
                anchor = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else package
                level = len(name) - len(name.lstrip("."))
                base = anchor.split(".")
                name = ".".join(base[:len(base) - level + 1] + [name.lstrip(".")])
            names = [name]
        for name in names:
            if name == "dtrlab" or name.startswith("dtrlab."):
                target = _resolve(name)
                if target is not None and target != module and (node.lineno, target) not in found:
                    found.append((node.lineno, target))
    return found


GRAPH = {module: imports(module) for module in MODULES}
for _extension in EXTENSIONS:
    GRAPH.setdefault(_extension, [])


def test_the_layer_table_covers_every_package():
    for module in MODULES:
        layer(module)  # raises for a package that is in no layer


def test_no_module_imports_a_higher_layer():
    upward = [f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {target} "
              f"({_layer_name(layer(m))} -> {_layer_name(layer(target))})"
              for m, edges in GRAPH.items() for line, target in edges
              if layer(target) > layer(m) or (target == "dtrlab" and m != "dtrlab.__main__")]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_utility_modules_import_nothing_of_dtrlab():
    offending = [f"{m} imports {target}" for m, edges in GRAPH.items() if layer(m) == UTILITY for _, target in edges]
    assert not offending, offending


def test_no_import_cycle_between_modules():
    cycles = [cycle for cycle in _strongly_connected({m: {t for _, t in e} for m, e in GRAPH.items()}) if len(cycle) > 1]
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def test_the_checker_sees_imports_inside_functions_relative_ones_and_cycles():
    edges = {target for _, target in GRAPH["dtrlab.calibrated.monotone"]}
    assert {"dtrlab.sweep", "dtrlab.policies.base", "dtrlab.runtime"} <= edges  # `from ..sweep import` in a function
    assert "dtrlab.runtime._core" in {target for _, target in GRAPH["dtrlab.runtime.compiled"]}  # `from . import _core`
    assert layer("dtrlab.policies.base") < layer("dtrlab.calibrated.monotone") < layer("dtrlab.analysis.holes")
    components = _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert sorted(map(sorted, components)) == [["a", "b", "c"], ["d"]]


def _layer_name(rank: int) -> str:
    return "utility" if rank == UTILITY else "façade" if rank == FACADE else LAYERS[rank]


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
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
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components
