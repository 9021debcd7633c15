"""The package's shape, read from its own source: imports only go down the layers (no circles, no
upward import), and no module grows past what one reading holds."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "inferd"

# Highest first. A module may import from its own package and from layers below its own, never from a
# layer above it or from another package of its own layer.
LAYERS: list[set[str]] = [
    {"__main__"},
    {"cli"},
    {"server", "planning"},
    {"grpc", "http"},  # the two networks, side by side: neither imports the other
    {"calls", "openapi"},  # the call layer under both; the API's document
    {"wire"},  # every dialect's body parsers and answer writers
    {"admission"},
    {"models"},
    {"scheduling", "execution"},
    {"observability", "backends", "bench", "client"},
    {"errors", "config", "messages", "lifecycle", "process_settings", "__init__"},
    {"typed_tables"},
]
MAX_LINES = 300  # one reading; past it a module's docstring says why it is one module ("Why one module: ...")
HARD_MAX_LINES = 400


def _part(module: str) -> str:
    """The package (or top-level module) a dotted module name belongs to: inferd.http.api -> http."""
    return module.split(".")[1] if module.count(".") else "__init__"


def _layer(part: str) -> int:
    return next(i for i, parts in enumerate(LAYERS) if part in parts)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(module: str, path: Path, *, runtime_only: bool) -> set[str]:
    """The inferd modules `module` imports (inside `if TYPE_CHECKING:` too, unless `runtime_only`)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(child) for child in ast.walk(node))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("inferd"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("inferd"):
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)  # `from . import reports`: a module
    return found


def test_imports_only_go_down_the_layers():
    wrong = []
    modules = _modules()
    for module, path in modules.items():
        mine = _part(module)
        for target in _imports(module, path, runtime_only=False):
            if target not in modules:
                target = target.rpartition(".")[0]  # `from .x import name`: the module is x
            theirs = _part(target)
            if theirs == mine or (mine == "__init__" and theirs == "__init__"):
                continue
            if _layer(theirs) <= _layer(mine):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_network_and_the_gate_reach_the_gpu_side_and_the_backends_only_through_the_models():
    """No skipped layer: the HTTP handlers and admission ask a model; they never read its executor's
    breaker or import a backend to reach into an engine."""
    skipped = []
    modules = _modules()
    for module, path in modules.items():
        if _part(module) in ("http", "admission"):
            skipped += [f"{module} imports {t}" for t in _imports(module, path, runtime_only=False)
                        if _part(t) in ("execution", "backends")]
    assert not skipped, "\n".join(sorted(skipped))


def test_the_core_reaches_backends_only_through_their_contract():
    """A backend, batch function or generation engine, is chosen by the config's `backend` and built through
    `inferd.backends`: no module outside `backends/` imports a concrete one (vLLM's, the simulated GPU...),
    so a new one is one module and a config line."""
    concrete = []
    modules = _modules()
    for module, path in modules.items():
        if _part(module) == "backends":
            continue
        for target in _imports(module, path, runtime_only=False):
            if target not in modules:
                target = target.rpartition(".")[0]  # `from .x import name`: the module is x
            if _part(target) == "backends" and target not in ("inferd.backends", "inferd.backends.contract"):
                concrete.append(f"{module} imports {target}")
    assert not concrete, "\n".join(sorted(concrete))


def test_no_import_circles_not_even_for_type_checking():
    modules = _modules()
    graph = {m: {t for t in _imports(m, p, runtime_only=False) if t in modules and t != m} for m, p in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node)


def test_no_module_grows_past_one_reading_without_saying_why():
    long = {p: n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    unexplained = {str(p.relative_to(PACKAGE)): n for p, n in long.items()
                   if n > HARD_MAX_LINES or "Why one module:" not in (ast.get_docstring(ast.parse(p.read_text())) or "")}
    assert not unexplained, unexplained
