"""The package's import graph: no circles, and imports only point down the layers of docs/design.md.

Every module of ``longrm_jax`` is parsed with ``ast``; every ``import`` counts, at module level or inside a
function (a function-level import hides a circle from the interpreter, not from this test). Relative imports
are resolved; ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = "longrm_jax"
ROOT = pathlib.Path(__file__).resolve().parent.parent / PACKAGE

# The allowed direction, top to bottom (docs/design.md, "design"): a module may import modules of its own
# group and of any group *below* it, never above. Groups are matched by longest module-name prefix.
LAYERS = (
    ("longrm_jax", "longrm_jax.train", "longrm_jax.evaluate", "longrm_jax.export", "longrm_jax.launch",
     "longrm_jax.data.inspect_data"),
    ("longrm_jax.training", "longrm_jax.evaluation"),
    ("longrm_jax.data", "longrm_jax.hf"),
    ("longrm_jax.models",),
    ("longrm_jax.ops",),
    ("longrm_jax.parallel", "longrm_jax.losses", "longrm_jax.cli_support", "longrm_jax.config_rules",
     "longrm_jax.xla_flags", "longrm_jax.xla_log", "longrm_jax.compile_cache"),
)
# Packages of one layer that must not import each other either (siblings, not a chain).
INDEPENDENT = (
    ("longrm_jax.training", "longrm_jax.evaluation"),
    ("longrm_jax.data", "longrm_jax.hf"),
    ("longrm_jax.parallel", "longrm_jax.losses"),
)
# losses.py is pure: jax only; cli_support (one-line errors, --debug) serves every CLI, data's included;
# xla_flags (process-wide flags the CLIs set before the backend starts) and xla_log (XLA's C++ memory log lines
# hidden while programs compile) and compile_cache (the persistent compilation cache a CLI points JAX at) know
# nothing else of the package.
LEAVES = ("longrm_jax.losses", "longrm_jax.cli_support", "longrm_jax.xla_flags", "longrm_jax.xla_log",
          "longrm_jax.compile_cache")

def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str, path: pathlib.Path, modules, package: str = PACKAGE) -> set[str]:
    """Modules of ``package`` that ``name`` imports anywhere in its file."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if (target == package or target.startswith(package + ".")) and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def group_of(name: str) -> str:
    members = [g for layer in LAYERS for g in layer if name == g or name.startswith(g + ".")]
    return max(members, key=len)


def layer_of(group: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if group in layer)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); components of more than one module, i.e. circles."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = 0
    for root in graph:
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
                    out.append(sorted(component))
    return out


def test_every_module_has_a_layer():
    for name in all_modules():
        assert layer_of(group_of(name)) >= 0, name


def test_no_import_circles():
    circles = strongly_connected(import_graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_imports_point_down_the_layers():
    bad = []
    for src, targets in import_graph().items():
        src_group = group_of(src)
        for dst in sorted(targets):
            dst_group = group_of(dst)
            if src_group in LEAVES and dst_group != src_group:
                bad.append(f"{src} -> {dst} (a leaf imports nothing of the package)")
            elif layer_of(dst_group) < layer_of(src_group):
                bad.append(f"{src} -> {dst} (upward)")
            elif any(src_group in pair and dst_group in pair and src_group != dst_group for pair in INDEPENDENT):
                bad.append(f"{src} -> {dst} (between siblings)")
    assert not bad, "imports against docs/design.md's direction:\n" + "\n".join(bad)


def test_the_walker_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from .a import f\nimport pkg.c\n")
    (pkg / "c.py").write_text("")
    modules = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py", "pkg.c": pkg / "c.py"}
    graph = {n: imports_of(n, p, modules, package="pkg") for n, p in modules.items()}
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a", "pkg.c"}
    assert strongly_connected(graph) == [["pkg.a", "pkg.b"]]
