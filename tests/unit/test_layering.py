"""The import rules of DESIGN.md, checked on the source: every ``import`` in every .py file under
slime_async/, policies/ and actors/ (at module level, inside functions and under TYPE_CHECKING alike).

- the runtime (``slime_async``) imports no component, no RL rule, no example, test or benchmark;
- the RL rules (``policies``) import neither the components nor the runtime;
- a component (a package or module directly under actors/) imports no other component; only the
  composition root (``actors/loop``) knows them all; shared libraries (``actors/megatron``) import
  no component, and components may import them;
- no module is over 600 lines.

Exceptions are named below, each with its reason; an exception that no longer applies fails too,
so the lists only shrink.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("slime_async", "policies", "actors")
PROJECT = ("slime_async", "policies", "actors", "examples", "tests", "benchmarks")

COMPOSITION_ROOT = "loop"  # actors/loop: CLI, run config, placement, launch, the loop's wiring
LIBRARIES = ("megatron",)  # actors/megatron: the rank machinery of both torchrun groups (trainer, critic)

# (importing file, imported module): the README's "Where the code differs from DESIGN.md".
ALLOWED_IMPORTS = {
    # slime plug-ins import slime's DAPO rule at this path; the rule is RL math and lives in policies/.
    ("slime_async/compat/slime/rollout/rm_hub/math_dapo_utils.py", "policies.dapo_score"),
}
MAX_LINES = 600
ALLOWED_LONG_FILES: set[str] = set()


@dataclass(frozen=True)
class Import:
    path: str  # the importing file, relative to the repository root
    line: int
    module: str  # dotted, relative imports resolved; `from a.b import c` gives a.b.c

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.module}"


def module_name(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: str, source: str) -> list[Import]:
    """Every import in ``source`` wherever it stands (``ast.walk`` visits function bodies and
    ``if TYPE_CHECKING:`` blocks like the module level), and ``importlib.import_module("literal")``."""
    package = module_name(path).split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            found += [Import(path, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [Import(path, node.lineno, f"{module}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append(Import(path, node.lineno, node.args[0].value))
    return found


def sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))}


SOURCES = sources()
IMPORTS = [imp for path, text in SOURCES.items() for imp in imports_of(path, text)]


def top(module: str) -> str:
    return module.split(".")[0]


def component(module: str) -> str | None:
    """``actors.<X>...`` -> X (a component, the composition root or a library); None otherwise."""
    parts = module.split(".")
    return parts[1] if parts[0] == "actors" and len(parts) > 1 else None


def components() -> set[str]:
    entries = {p.stem for p in (ROOT / "actors").iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    return entries - {COMPOSITION_ROOT, *LIBRARIES}


def allowed(imp: Import) -> bool:
    """Whether an allow-list entry covers ``imp`` (an entry names a module: `from m import f` is in it)."""
    return any(imp.path == path and (imp.module == module or imp.module.startswith(module + "."))
               for path, module in ALLOWED_IMPORTS)


def runtime_violations(imports: list[Import]) -> list[Import]:
    return [imp for imp in imports if imp.path.startswith("slime_async/")
            and top(imp.module) in PROJECT and top(imp.module) != "slime_async" and not allowed(imp)]


def policy_violations(imports: list[Import]) -> list[Import]:
    return [imp for imp in imports if imp.path.startswith("policies/")
            and top(imp.module) in PROJECT and top(imp.module) != "policies"]


def component_violations(imports: list[Import], known: set[str]) -> list[Import]:
    """A component importing another component, or a library importing any component."""
    bad = []
    for imp in imports:
        if not imp.path.startswith("actors/"):
            continue
        source, target = component(module_name(imp.path)), component(imp.module)
        # source None: actors/__init__.py, held to the libraries' rule
        if target in known and source != target and source != COMPOSITION_ROOT:
            bad.append(imp)
    return bad


def long_files(texts: dict[str, str]) -> dict[str, int]:
    return {path: n for path, text in texts.items() if (n := len(text.splitlines())) > MAX_LINES}


def _report(bad: list[Import]) -> str:
    return "\n".join(map(str, bad))


# ----- the rules, on the repository ------------------------------------------------------------

def test_the_runtime_imports_no_component_rule_example_test_or_benchmark():
    bad = runtime_violations(IMPORTS)
    assert not bad, _report(bad)


def test_the_rules_import_neither_the_components_nor_the_runtime():
    bad = policy_violations(IMPORTS)
    assert not bad, _report(bad)


def test_a_component_imports_no_other_component_and_a_library_none():
    bad = component_violations(IMPORTS, components())
    assert not bad, _report(bad)


def test_no_module_is_over_600_lines():
    over = {path: n for path, n in long_files(SOURCES).items() if path not in ALLOWED_LONG_FILES}
    assert not over, "\n".join(f"{path}: {n} lines (at most {MAX_LINES})" for path, n in sorted(over.items()))


def test_every_allowed_import_is_still_made():
    stale = {(path, module) for path, module in ALLOWED_IMPORTS
             if not any(imp.path == path and (imp.module == module or imp.module.startswith(module + "."))
                        for imp in IMPORTS)}
    assert not stale, f"no longer imported, drop from ALLOWED_IMPORTS: {sorted(stale)}"


def test_every_allowed_long_file_is_still_long():
    stale = ALLOWED_LONG_FILES - set(long_files(SOURCES))
    assert not stale, f"at most {MAX_LINES} lines now (or gone), drop from ALLOWED_LONG_FILES: {sorted(stale)}"


def test_the_composition_root_and_the_libraries_exist_and_the_components_are_found():
    assert (ROOT / "actors" / COMPOSITION_ROOT / "__init__.py").exists()
    assert all((ROOT / "actors" / name / "__init__.py").exists() for name in LIBRARIES)
    assert {"engine", "router", "rollout", "buffer", "trainer", "critic", "monitor"} <= components()


# ----- the checker catches a violation wherever the import stands --------------------------------

KNOWN = {"router", "rollout", "trainer", "critic"}


@pytest.mark.parametrize("source", [
    "from actors.router.completion import find_stop\n",
    "import actors.router.completion\n",
    "def f():\n    from actors.router import completion\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from actors.router.completion import Completion\n",
    "from ..router.completion import find_stop\n",
    "from .. import router\n",
    "import importlib\nmodule = importlib.import_module('actors.router.completion')\n",
])
def test_a_component_importing_another_is_caught_wherever_the_import_stands(source):
    assert [imp.line for imp in component_violations(imports_of("actors/rollout/generate.py", source), KNOWN)]


def test_a_component_may_import_itself_a_library_the_runtime_and_the_rules():
    source = ("from actors.rollout.config import RolloutConfig\nfrom .hooks import load\n"
              "from actors.megatron.rank import MegatronRank\nfrom slime_async.actor import Actor\n"
              "from policies.staleness import staleness\n")
    assert component_violations(imports_of("actors/rollout/generate.py", source), KNOWN) == []


def test_the_composition_root_may_import_every_component():
    source = "from actors.router.actor import RouterActor\nfrom actors.trainer.actor import TrainerActor\n"
    assert component_violations(imports_of("actors/loop/launch.py", source), KNOWN) == []


def test_a_library_importing_a_component_is_caught():
    source = "def build():\n    from actors.critic.ops import CriticOps\n"
    assert [str(imp) for imp in component_violations(imports_of("actors/megatron/worker.py", source), KNOWN)] == [
        "actors/megatron/worker.py:2 imports actors.critic.ops.CriticOps"]


def test_the_runtime_importing_a_component_a_rule_or_an_example_is_caught():
    source = ("def f():\n    from actors.router.completion import find_stop\n"
              "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from policies.algorithm import AlgorithmConfig\n"
              "import examples.models.tiny\n")
    assert sorted(imp.line for imp in runtime_violations(imports_of("slime_async/stop_strings.py", source))) == [2, 5, 6]


def test_the_allowed_runtime_import_is_allowed_only_in_its_file():
    source = "def f():\n    from policies.dapo_score import dapo_score\n"
    assert runtime_violations(imports_of("slime_async/compat/slime/rollout/rm_hub/math_dapo_utils.py", source)) == []
    assert runtime_violations(imports_of("slime_async/compat/slime/rollout/rm_hub/other.py", source))


def test_a_rule_importing_the_runtime_is_caught():
    source = "from slime_async.sample import Sample\n"
    assert policy_violations(imports_of("policies/staleness.py", source))


def test_a_module_of_601_lines_is_too_long_and_600_are_not():
    assert long_files({"a.py": "x = 1\n" * 601, "b.py": "x = 1\n" * 600}) == {"a.py": 601}
