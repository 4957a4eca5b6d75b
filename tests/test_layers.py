"""The import graph of dtrlab: no module imports a higher layer (not even inside a function), no cycles.

Every module is parsed with ``ast``; every ``import`` and ``from ... import`` counts,
wherever it stands (module level, function, ``if TYPE_CHECKING``), and so does
``importlib.import_module`` with a literal name. The layers, lowest first, are those
of docs/architecture.md ("What is in the package"); a module may import its own layer or a lower
one. Top-level modules such as ``dtrlab/version.py`` are utilities below every layer
and import nothing of dtrlab; ``dtrlab/__init__.py`` is the façade above all of them,
and no module of dtrlab imports it.

No module reaches a private name of another package (:func:`private_reaches` states the rule).
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
          "search", "plots", "widgets", "pipeline", "cli"]
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


def _imported_by_call(node: ast.AST, package: str) -> str | None:
    """The absolute module name of ``importlib.import_module("literal"[, "anchor"])`` (relative names resolved
    against ``anchor``, else ``package``), or None when ``node`` is no such call."""
    if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return None
    name = node.args[0].value
    if name.startswith("."):
        anchor = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else package
        level = len(name) - len(name.lstrip("."))
        base = anchor.split(".")
        name = ".".join(base[:len(base) - level + 1] + [name.lstrip(".")])
    return name


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
        elif _imported_by_call(node, package) is not None:
            names = [_imported_by_call(node, package)]
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


def package_of(name: str) -> str:
    """The package a dotted dtrlab name belongs to: ``dtrlab.<package>``, a top-level module
    (``dtrlab.version``) or the façade ``dtrlab``."""
    return ".".join(name.split(".")[:2])


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_reaches(module: str, source: str | None = None) -> list[str]:
    """Where ``module`` reaches a private name of another package: ``(line) name`` for each.

    A name is private when one of its dotted parts starts with an underscore (dunders such as
    ``__version__`` are public). The check covers ``from M import _x``, ``from M._m import x``,
    ``import M._m``, ``importlib.import_module("M._m")`` with a literal name, and an attribute ``alias._x`` (or ``alias.y._x``) where ``alias`` is bound in
    the module by an import, wherever those stand (functions included), when the private name
    belongs to another package than ``module``'s (:func:`package_of`): a package's own private
    modules and names, such as ``dtrlab.runtime._core`` imported by ``dtrlab.runtime.compiled``,
    are its own business. Relative imports resolve as in :func:`imports`. An attribute of an
    instance (``sim._x``) is out of reach of this static check.
    """
    path = MODULES.get(module)
    tree = ast.parse(path.read_text() if source is None else source)
    package = module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]
    home = package_of(module)
    bound, found = {}, []

    def reach(line: int, name: str) -> None:
        parts = name.split(".")
        if parts[0] == "dtrlab" and package_of(name) != home and any(map(_private, parts[1:])):
            found.append(f"({line}) {name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                reach(node.lineno, alias.name)
                # `import a.b` binds a; `import a.b as c` binds c to a.b
                bound[alias.asname or alias.name.partition(".")[0]] = (alias.name if alias.asname
                                                                       else alias.name.partition(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            source_module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                reach(node.lineno, f"{source_module}.{alias.name}")
                bound[alias.asname or alias.name] = f"{source_module}.{alias.name}"
        elif _imported_by_call(node, package) is not None:
            reach(node.lineno, _imported_by_call(node, package))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                reach(node.lineno, ".".join([bound[value.id], *reversed(chain)]))
    return found


def test_no_module_reaches_a_private_name_of_another_package():
    reaches = [f"{MODULES[m].relative_to(PACKAGE.parent)} {where}" for m in MODULES for where in private_reaches(m)]
    assert not reaches, ("private names of another package (make the name public where it is an interface, "
                         "or move the code to its owner):\n" + "\n".join(reaches))


def test_the_private_name_check_sees_every_form():
    source = """
from ..memory.caching import _divisions_table
from dtrlab.runtime import _core
import dtrlab.runtime._core
from ..policies import coop
from ..policies.coop import Coop as Cooperative
from . import _own_helper, holes
from ..version import __version__


def use():
    import dtrlab
    return coop._cheapest_window, Cooperative._block_cost, dtrlab.memory.caching._Pool, holes._private


def load():
    importlib.import_module("dtrlab.runtime._core")
    import_module("..trace._logparse", "dtrlab.analysis")
    return importlib.import_module("dtrlab.analysis._own")
"""
    found = private_reaches("dtrlab.analysis.holes", source)
    assert found == ["(2) dtrlab.memory.caching._divisions_table", "(3) dtrlab.runtime._core",
                     "(4) dtrlab.runtime._core", "(17) dtrlab.runtime._core", "(18) dtrlab.trace._logparse",
                     "(13) dtrlab.policies.coop._cheapest_window", "(13) dtrlab.policies.coop.Coop._block_cost",
                     "(13) dtrlab.memory.caching._Pool"]  # imports first, then attributes


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


def _python_sources_outside_tests() -> dict[str, str]:
    """Every Python source of the checkout but the tests': the package, scripts/, benchmarks/ and the
    notebooks' code cells (one source per notebook)."""
    import json

    root = PACKAGE.parent
    sources = {str(p.relative_to(root)): p.read_text() for folder in ("dtrlab", "scripts", "benchmarks")
               for p in sorted((root / folder).rglob("*.py"))}
    for notebook in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        sources[str(notebook.relative_to(root))] = "\n".join(
            "".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
    return sources


def test_nothing_outside_tests_imports_tests():
    tests = {p.stem for p in Path(__file__).parent.glob("*.py")}
    offending = []
    for name, source in _python_sources_outside_tests().items():
        for node in ast.walk(ast.parse(source, name)):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                       [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offending += [f"{name}:{node.lineno} imports {m}" for m in modules
                          if m.split(".")[0] in tests or m.split(".")[0] == "tests"]
    assert not offending, offending


def test_scripts_and_benchmarks_import_the_installed_package_not_paths():
    """No ``sys.path`` edit in scripts/ or benchmarks/: they import dtrlab as installed (``make setup``)."""
    edits = [f"{name}:{node.lineno}" for name, source in _python_sources_outside_tests().items()
             if name.startswith(("scripts/", "benchmarks/"))
             for node in ast.walk(ast.parse(source, name))
             if isinstance(node, ast.Attribute) and node.attr == "path"
             and isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert not edits, edits


# ------------------------------------------------------------------ each function small enough to read
MAX_PARAMETERS, MAX_LINES = 10, 100


def oversized_functions(source: str, where: str = "") -> list[str]:
    """Functions of ``source`` with more than MAX_PARAMETERS parameters (``self``/``cls`` aside, ``*args`` and
    ``**kwargs`` one each) or more than MAX_LINES lines (decorators aside, docstring included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = node.args
        named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
        count = len(named) + (arguments.vararg is not None) + (arguments.kwarg is not None)
        count -= bool(named) and named[0].arg in ("self", "cls")
        lines = node.end_lineno - node.lineno + 1
        if count > MAX_PARAMETERS or lines > MAX_LINES:
            found.append(f"{where}{node.name}: {count} parameters, {lines} lines")
    return found


def test_no_function_has_over_ten_parameters_or_a_hundred_lines():
    found = [item for name, path in MODULES.items() for item in oversized_functions(path.read_text(), f"{name}.")]
    assert found == []


def test_the_size_check_counts_parameters_and_lines():
    eleven = "def f(self, a, b, c, d, e, f, g, h, i, *args, **kwargs):\n    pass\n"
    long = "def g():\n" + "    x = 1\n" * 100
    fine = "class C:\n    def m(self, a, b, c, d, e, f, g, h, i, j):\n" + "        x = 1\n" * 98
    assert oversized_functions(eleven) == ["f: 11 parameters, 2 lines"]
    assert oversized_functions(long) == ["g: 0 parameters, 101 lines"]
    assert oversized_functions(fine) == []
