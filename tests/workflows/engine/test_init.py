"""The engine's face (``workflows/engine/__init__.py``) and the boundary it draws in the layout.

The folders say where a change goes (docs/architecture.md, "Where things are") only while the code keeps
to them: the features beside the engine reach it through its face, never through one of its modules'
paths, and the engine reaches into a feature only where listed below (each a known debt, with why).
A new import across the boundary fails here, with the file and line to look at.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import durapay.workflows.engine as engine

ROOT = Path(__file__).resolve().parents[3]
ENGINE = ROOT / "workflows" / "engine"
#: What is not the engine: the features beside it, the other folders, the public package, bench, examples.
OUTSIDE = ("config", "gateway", "service", "simulator", "tasks", "workflows", "bench", "examples")
MODULES = frozenset(path.stem for path in ENGINE.glob("*.py")) - {"__init__"}

#: Engine modules a feature uses as a whole (``inflight.unsettled(...)``), imported from the package.
USED_WHOLE = frozenset({"inflight", "versions", "operator_actions", "modules", "terminals"})
#: Imports of an engine module's own path outside the engine: a name the face cannot hold (``compact``
#: is also the engine's module ``compact``).
DEEP = {
    ("workflows/schedules/model.py", "durapay.workflows.engine.jsonform"),
    # The store's bench runs the dispatcher's packing pass itself, as tests/workflows/test_start_costs.py does.
    ("bench/bench_store.py", "durapay.workflows.engine.compact"),
}
#: Where the engine reaches into a feature (the layout's debts: each could move into the engine or be
#: handed in by the features, so that the arrow goes one way only).
INTO_FEATURES = {
    # Engine.late_payments, Engine.list and Engine.pause are the features' own objects, built by the engine.
    ("api.py", "durapay.workflows.late_payments"),
    ("api.py", "durapay.workflows.listing"),
    ("api.py", "durapay.workflows.pauses"),
    # A wait's keep-until rule and the waits' margins live with the built-in kinds that wait.
    ("api.py", "durapay.workflows.flows.waits"),
    ("inflight.py", "durapay.workflows.flows.waits"),
    # operation_of (which gateway operation a step calls) lives with the built-in kinds' shared helpers.
    ("inflight.py", "durapay.workflows.flows._common"),
    ("protocol.py", "durapay.workflows.flows._common"),
    # A late payment's refund key is named by the feature that refunds it.
    ("protocol.py", "durapay.workflows.late_payments"),
    # The registry is durapay's kinds and the merchant's: the built-in kinds are loaded by name.
    ("modules.py", "durapay.workflows.flows"),
}


def sources(folders: tuple[str, ...]) -> list[Path]:
    paths = [path for folder in folders for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts]
    return sorted(paths + list((ROOT / "durapay").glob("*.py")))


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of each import statement of ``path``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
    return found


def test_every_name_of_the_face_resolves_and_is_listed() -> None:
    assert sorted(engine.__all__) == sorted(engine._HOMES)
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
    assert not MODULES & set(engine.__all__), "a name of the face hides a module of the engine"


def test_importing_the_face_or_one_module_loads_no_other() -> None:
    """A receiver importing ``sensitive``, the CLI's completion importing ``keys``: nothing else of the
    engine, and not its API (Celery, the gateway client, the features it builds)."""
    probe = (
        "import sys; import durapay.workflows.engine, durapay.workflows.engine.sensitive; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('durapay.workflows'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True, cwd=ROOT)
    assert done.stdout.split() == ["durapay.workflows", "durapay.workflows.engine", "durapay.workflows.engine.sensitive"]


def test_outside_the_engine_nothing_imports_one_of_its_modules_by_path() -> None:
    wrong = []
    for path in sources(OUTSIDE):
        if path.is_relative_to(ENGINE):
            continue
        relative = path.relative_to(ROOT).as_posix()
        for line, module, names in imports(path):
            if module.startswith("durapay.workflows.engine.") and (relative, module) not in DEEP:
                wrong.append(f"{relative}:{line} {module} (import it from durapay.workflows.engine)")
            if module == "durapay.workflows.engine":
                wrong += [f"{relative}:{line} module {name} used whole" for name in set(names) & MODULES - USED_WHOLE]
    assert wrong == []


def test_the_engine_reaches_into_a_feature_only_where_listed() -> None:
    found = set()
    for path in sorted(ENGINE.rglob("*.py")):
        for _line, module, _names in imports(path):
            if module.startswith("durapay.workflows.") and not module.startswith("durapay.workflows.engine"):
                found.add((path.relative_to(ENGINE).as_posix(), module))
    assert found == INTO_FEATURES
