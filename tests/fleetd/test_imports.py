"""fleetd's modules import each other without a cycle, counting imports inside functions too: a
function-level import can hide a cycle from Python's loader, not from this test."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("fleetd", "agent", "fleetwire", "fleetconf")


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package):
    return {
        _module_name(p): p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts
    }


def _imported(name, node, modules, is_package):
    """The modules of this tree that one import statement names."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        package = name if is_package else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    found = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:  # `from package import module`
            found.add(f"{base}.{alias.name}")
        elif base in modules:
            found.add(base)
    return found


def import_graph(package):
    """{module: {modules it imports, at any depth of its code}} within one package."""
    modules = _modules(package)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(name, node, modules, path.name == "__init__.py")
        graph[name] = edges - {name}
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
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
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_itself_through_others(package):
    graph = import_graph(package)
    assert graph  # the package was read
    assert cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    source = (
        "import os\n\ndef f():\n    from fleetd.services.workloads import jobs\n    return jobs\n"
    )
    node = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)][0]
    modules = {
        "fleetd.services.workloads",
        "fleetd.services.workloads.jobs",
        "fleetd.services.workloads.runs",
    }
    assert _imported("fleetd.services.workloads.runs", node, modules, False) == {
        "fleetd.services.workloads.jobs"
    }


def _reach(graph, module):
    reached, todo = set(), [module]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    return reached


def test_services_are_layered_state_machines_below_runs_below_use_cases():
    graph = import_graph("fleetd")
    s = "fleetd.services."
    below = {
        s + "workloads.lifecycle": {
            s + "workloads.runs",
            s + "workloads.jobs",
            s + "workloads.instances",
            s + "nodes.nodes",
            s + "placement.scheduling",
        },
        s + "workloads.runs": {
            s + "workloads.jobs",
            s + "workloads.instances",
            s + "nodes.nodes",
            s + "placement.scheduling",
            s + "placement.cluster",
        },
        s + "placement.cluster": {
            s + "workloads.jobs",
            s + "workloads.instances",
            s + "placement.policy",
            s + "placement.scheduling",
            s + "placement.capacity",
            "fleetd.runtime",
        },
    }
    for module, must_not_reach in below.items():
        reached = _reach(graph, module)
        assert not reached & must_not_reach, (module, sorted(reached & must_not_reach))


def test_the_scheduler_reaches_no_service_model_or_database():
    reached = _reach(import_graph("fleetd"), "fleetd.scheduler")
    assert reached  # it was walked
    assert not {
        m for m in reached if m.startswith(("fleetd.services", "fleetd.models", "fleetd.db"))
    }


SERVICES = ROOT / "fleetd" / "services"
MAX_SERVICE_LINES = 500  # lines as `ruff format` lays them out at 100 columns


def test_services_live_in_domains_and_no_service_module_is_long():
    flat = sorted(
        p.name for p in SERVICES.glob("*.py") if p.name not in {"__init__.py", "pagination.py"}
    )
    assert flat == []  # a new service goes in its domain's package
    for domain in (p for p in SERVICES.iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = domain / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), (
            domain
        )  # the domain's map
        for module in domain.glob("*.py"):
            lines = len(module.read_text().splitlines())
            assert lines <= MAX_SERVICE_LINES, (str(module.relative_to(ROOT)), lines)


def test_no_service_imports_flask_and_state_is_passed_not_looked_up():
    """Services take the Runtime (and whatever else they need) as arguments: no Flask, no request or
    app globals below the API layer."""
    found = []
    for path in SERVICES.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(
                a.name.split(".")[0] == "flask" for a in node.names
            ):
                found.append(str(path.relative_to(ROOT)))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "flask":
                found.append(str(path.relative_to(ROOT)))
    assert found == []
