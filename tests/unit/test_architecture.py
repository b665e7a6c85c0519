"""The house rules of sparkd/, held by a test: no import circle, no import from a lower layer to a higher one,
no module past 400 lines, no function past 60."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "sparkd"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# Floors, lowest first: a module may import only from its own floor or below. A package is one room; the pure
# core is the config, the launch and the supervisor (floors 1-2). The adapters stand on the ladder their imports
# make: what survives a restart, then the runtimes and the commands (the peer link calls the ranks' commands by
# their descriptors; the commands import no adapter but state/), the guard, the preflight (it reads the guard's
# memory figures) and the recorder, the group. The daemon stands in wings, each a floor of its own: the loop and
# boot import no other wing; the senses post to the loop; the effects start the senses; the views read them all;
# the composition root builds them.
LAYERS: list[tuple[str, ...]] = [
    ("sparkd", "sparkd.vllm_probe"),  # the plugin that runs inside vLLM: the standard library only
    ("sparkd.config",),
    ("sparkd.launch", "sparkd.supervisor"),
    ("sparkd.host",),
    ("sparkd.state", "sparkd.notify"),
    ("sparkd.runtime", "sparkd.commands"),
    ("sparkd.guard",),
    ("sparkd.preflight", "sparkd.recorder", "sparkd.acceptance"),
    ("sparkd.cluster",),
    ("sparkd.api",),
    ("sparkd.daemon.loop",),
    ("sparkd.daemon.boot",),
    ("sparkd.daemon.watch",),
    ("sparkd.daemon.effects",),
    ("sparkd.daemon.views",),
    ("sparkd.daemon",),
    ("sparkd.cli", "sparkd.testing"),
]
# The wings of the daemon: every module of sparkd/daemon/ but the composition root lives in one.
DAEMON_WINGS = ("loop", "boot", "watch", "effects", "views")
DAEMON_ROOT_MODULES = {"sparkd.daemon", "sparkd.daemon.app", "sparkd.daemon.adapters"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def floor(module: str) -> int:
    best = (-1, -1)  # (length of the matching prefix, floor)
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "sparkd"  # the package itself: no wildcard
            if (module == prefix or inside) and len(prefix) > best[0]:
                best = (len(prefix), level)
    assert best[1] >= 0, f"{module} is on no floor: add it to LAYERS"
    return best[1]


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sparkd"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("sparkd"))
    return {m for m in found if m in MODULES}


GRAPH = {name: imports(path) - {name} for name, path in MODULES.items()}


def test_no_import_circle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert circles == []


def test_every_module_of_the_daemon_lives_in_a_wing() -> None:
    """A newcomer finds a part by what it does: the loop, boot, the senses, the effects, the views; only the
    composition root (``app``, ``adapters``) stands beside them."""
    loose = [m for m in MODULES if m.startswith("sparkd.daemon") and m not in DAEMON_ROOT_MODULES
             and m.split(".")[2] not in DAEMON_WINGS]
    assert loose == []


def test_no_import_climbs_a_floor() -> None:
    climbs = [f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)})"
              for m, targets in sorted(GRAPH.items()) for t in sorted(targets) if floor(t) > floor(m)]
    assert climbs == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_and_functions_stay_small(module: str) -> None:
    text = MODULES[module].read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{module}: split it along a real seam"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (node.end_lineno or 0) - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


MAX_CONSTRUCTOR_PARAMETERS = 8  # a part that needs more is two parts, or its parameters share a concept unnamed
DAEMON = ROOT / "daemon"
DATA_NAMES = {"str", "int", "float", "bool", "bytes", "None", "dict", "list", "tuple", "set", "frozenset", "Any"}


def constructor_parameters(cls: ast.ClassDef) -> int | None:
    """The parameters of ``cls``'s constructor (self excluded): its ``__init__``'s, or a mutable dataclass's fields.
    A frozen dataclass is a value (a stop's report, a record), not a part wired to others: its fields are data; so
    is a mutable one whose fields are all plain data (a fake device's readings), no part among them."""
    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            a = item.args
            return len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs) + (a.vararg is not None) + (
                a.kwarg is not None)
    decorators = [ast.unparse(d) for d in cls.decorator_list]
    if any("dataclass" in d for d in decorators) and not any("frozen=True" in d for d in decorators):
        fields = [item.annotation for item in cls.body if isinstance(item, ast.AnnAssign)
                  and "ClassVar" not in ast.unparse(item.annotation)]
        if all(_plain_data(annotation) for annotation in fields):
            return None
        return len(fields)
    return None


def _plain_data(annotation: ast.expr) -> bool:
    names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    names |= {n.value for n in ast.walk(annotation) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return names <= DATA_NAMES


def wide_constructors(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                n = constructor_parameters(node)
                if n is not None and n > MAX_CONSTRUCTOR_PARAMETERS:
                    found.append(f"{path.relative_to(folder)}: {node.name} takes {n}")
    return found


def test_no_part_of_sparkd_takes_more_than_eight_constructor_parameters() -> None:
    assert wide_constructors(ROOT) == []


def test_the_parameter_check_sees_a_wide_constructor(tmp_path: Path) -> None:
    """The check above can fail: a hub of nine parameters, and a mutable dataclass of nine fields one of which is a
    part, are both found; a frozen record of nine fields, or a mutable one of nine plain data fields, is a value
    and is not."""
    (tmp_path / "hub.py").write_text(
        "from dataclasses import dataclass\n\n"
        "class Hub:\n    def __init__(self, a, b, c, d, *, e, f, g, h, i=None):\n        pass\n\n"
        "class Small:\n    def __init__(self, a, *rest, **more):\n        pass\n\n"
        "@dataclass\nclass Parts:\n    clock: Clock\n" + "".join(f"    f{i}: int\n" for i in range(8)) +
        "\n@dataclass\nclass Readings:\n" + "".join(f"    f{i}: int | None\n" for i in range(9)) +
        "\n@dataclass(frozen=True)\nclass Record:\n" + "".join(f"    f{i}: int\n" for i in range(9)))
    assert wide_constructors(tmp_path) == ["hub.py: Hub takes 9", "hub.py: Parts takes 9"]


def test_the_composition_root_wires_in_one_pass() -> None:
    """No placeholder effects filled in later, no getter of a part not built yet (issue 26)."""
    text = (DAEMON / "app.py").read_text()
    assert "_Deferred" not in text
    assert "lambda: self." not in text
