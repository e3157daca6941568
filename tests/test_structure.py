"""The dependency arrows of docs/design.md ("dependencies point down"), checked on
every import in the package, module level and inside functions alike: a module that imports
against them fails here, naming the file, the line and the arrow."""

from __future__ import annotations

import ast
from pathlib import Path

from robo_rl.cli.main import VERBS

PACKAGE = Path(__file__).parents[1] / "robo_rl"

# room -> what it must not import (robo_rl.<room>, or a top-level package such as mujoco)
FORBIDDEN = {
    "data": {"robo_rl.policies", "robo_rl.rl", "robo_rl.learn", "robo_rl.rac", "robo_rl.runtime", "robo_rl.hardware",
             "robo_rl.sim", "robo_rl.cli", "mujoco"},          # episodes on disk: no models, no robots
    "policies": {"robo_rl.hardware", "robo_rl.sim", "robo_rl.cli", "robo_rl.runtime", "mujoco"},
    "rl": {"robo_rl.hardware", "robo_rl.sim", "robo_rl.cli", "robo_rl.runtime", "mujoco"},
    "learn": {"robo_rl.hardware", "robo_rl.sim", "robo_rl.cli", "robo_rl.runtime", "mujoco"},
    "hardware": {"robo_rl.sim", "robo_rl.cli", "robo_rl.policies", "robo_rl.rl", "robo_rl.learn", "mujoco"},
    "runtime": {"robo_rl.sim", "robo_rl.cli", "mujoco"},    # runs next to a real robot: no twin
    "rac": {"robo_rl.cli", "robo_rl.hardware", "mujoco"},
    "sim": {"robo_rl.cli"},                                 # only cli wires everything together
}


def imports(path: Path) -> list[tuple[str, int]]:
    """Every absolute import in the file: (module, line)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
    return out


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_rooms_import_along_the_arrows_only():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        room = path.relative_to(PACKAGE).parts[0]
        for module, line in imports(path):
            for banned in FORBIDDEN.get(room, ()):
                if _under(module, banned):
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module} ({room} -> {banned})")
    assert wrong == [], "\n".join(wrong)


def test_no_cli_verb_imports_another_verb():
    """Verbs share parts through cli/app.py, cli/session.py and cli/tables.py, never each other."""
    verbs = {module for module, _ in VERBS.values()}
    wrong = []
    for module in sorted(verbs):
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        for imported, line in imports(path):
            if imported != module and any(_under(imported, v) for v in verbs):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports the verb {imported}")
    assert wrong == [], "\n".join(wrong)


def test_the_check_sees_lazy_imports_and_the_verbs_exist():
    """The checks above cannot pass vacuously: function-level imports are found, and every verb
    of `robo-rl --help` is a file they read."""
    found = dict(imports(PACKAGE / "cli" / "deploy.py"))
    assert "robo_rl.policies.rtc" in found  # imported inside run(), only when rtc=true
    assert all((PACKAGE.parent / (m.replace(".", "/") + ".py")).is_file() for m, _ in VERBS.values())
    assert len(VERBS) >= 15


def test_no_verb_runs_a_round_of_its_own():
    """A RaC round (collect -> compose -> train -> evaluate) has one home, robo_rl/rac/experiment.py:
    a verb wires its collect and evaluate and calls it, and never trains on interventions itself.
    The demo's whole experiment (pre-train, rounds, control, rows) lives in robo_rl/rac/before_after.py."""
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
             for path in sorted((PACKAGE / "cli").glob("*.py"))
             for module, line in imports(path) if _under(module, "robo_rl.rac.finetune")]
    assert wrong == [], "\n".join(wrong) + "\n(call robo_rl.rac.experiment.run_rounds)"
    callers = {path.name for path in (PACKAGE / "cli").glob("*.py")
               if any(_under(m, "robo_rl.rac.experiment") for m, _ in imports(path))}
    assert {"demo.py", "rac.py"} <= callers
    assert any(_under(m, "robo_rl.rac.before_after") for m, _ in imports(PACKAGE / "cli" / "demo.py"))
    for verb in ("demo.py", "rac.py"):  # neither trains a policy itself: the pre-training is the experiment's too
        tree = ast.parse((PACKAGE / "cli" / verb).read_text())
        called = {getattr(n.func, "id", getattr(n.func, "attr", None)) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert not called & {"Learner", "finetune", "fit"}, (verb, called & {"Learner", "finetune", "fit"})


def _import_cycles(modules: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle in the import graph `modules` (module -> the modules it imports), each once."""
    cycles, seen = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(modules.get(node, ())):
            if nxt in path:
                cycle = path[path.index(nxt):]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    cycles.append(cycle + [nxt])
            else:
                walk(nxt, path + [nxt])

    for start in sorted(modules):
        walk(start, [start])
    return cycles


def test_the_runtime_modules_import_each_other_without_a_circle():
    """docs/design.md: chunking and inference import nothing of the runtime, episodes (the loop)
    neither of sources nor controller, sources builds on episodes, controller on both. Function-level
    imports count: a lazy import is still a circle."""
    runtime = {f"robo_rl.runtime.{p.stem}": p for p in (PACKAGE / "runtime").glob("*.py") if p.stem != "__init__"}
    graph = {name: {m for m, _ in imports(path) if m in runtime and m != name} for name, path in runtime.items()}
    assert {"robo_rl.runtime.episodes", "robo_rl.runtime.sources", "robo_rl.runtime.controller"} <= set(graph)
    assert "robo_rl.runtime.episodes" in graph["robo_rl.runtime.sources"]  # the check sees the arrows that exist
    assert _import_cycles(graph) == []
    assert _import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]  # and would see one
