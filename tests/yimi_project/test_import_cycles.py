"""No import cycle larger than three modules, in any app.

A cycle ties its modules together: none can be read, moved or tested without the others.
Work is started by name (``brain.dispatch``, ``brain.executors``), so the code that starts
work never imports the code that does it. The graph is import-linter's (grimp), built as
``lint-imports`` builds it: every import counts, one inside a function included (hiding an
import in a function does not break a cycle), except those under ``if TYPE_CHECKING:``,
which never run. A strongly connected component of more than ``MAX_CYCLE_MODULES`` modules
fails the test, with the imports that close it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
from django.conf import settings

MAX_CYCLE_MODULES = 3


def apps() -> list[str]:
    """The packages of the layers contract (``pyproject.toml``, ``[tool.importlinter]``)."""
    with (Path(settings.BASE_DIR) / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["tool"]["importlinter"]["root_packages"])


def strongly_connected_components(graph: grimp.ImportGraph) -> list[set[str]]:
    """Tarjan's algorithm over the graph's modules (iterative: a deep import chain must not
    hit the recursion limit); components of one module are left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[str, list[str]]] = [(root, sorted(graph.find_modules_directly_imported_by(root)))]
        while work:
            module, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.find_modules_directly_imported_by(nxt))))
                elif nxt in on_stack:
                    low[module] = min(low[module], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def too_large(graph: grimp.ImportGraph) -> list[str]:
    """Each component above the limit, with the imports inside it (importer -> imported: line)."""
    out = []
    for component in strongly_connected_components(graph):
        if len(component) <= MAX_CYCLE_MODULES:
            continue
        edges = []
        for importer in sorted(component):
            for imported in sorted(graph.find_modules_directly_imported_by(importer) & component):
                lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
                edges.append(f"  {importer} -> {imported}: line {', '.join(map(str, lines)) or '?'}")
        out.append(f"{len(component)} modules:\n" + "\n".join(edges))
    return out


def test_no_import_cycle_is_larger_than_three_modules() -> None:
    graph = grimp.build_graph(*apps(), exclude_type_checking_imports=True, cache_dir=None)
    cycles = too_large(graph)
    assert not cycles, "import cycles larger than 3 modules:\n" + "\n".join(cycles)


def test_the_check_finds_a_cycle_of_four_and_passes_one_of_three() -> None:
    """The detector itself: a ring of four modules fails, a ring of three and a chain pass."""
    graph = grimp.ImportGraph()
    for importer, imported in (("a.one", "a.two"), ("a.two", "a.three"), ("a.three", "a.one"), ("a.three", "a.four")):
        graph.add_import(importer=importer, imported=imported)
    assert too_large(graph) == []
    graph.add_import(importer="a.four", imported="a.one")  # now a.one -> two -> three -> four -> one
    (cycle,) = too_large(graph)
    assert cycle.startswith("4 modules:") and "a.four -> a.one" in cycle
