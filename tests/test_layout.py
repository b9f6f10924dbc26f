"""The package layout keeps the data path one-way (docs/architecture.md, "Subpackages and what they may
import"): what each part of madqn may import, no import circle between any two modules, and ``import madqn``
without the command line."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "madqn"
LOWER = {"madqn.core", "madqn.envs", "madqn.training", "madqn.config", "madqn.errors"}
# part of madqn (a subpackage, or a module directly under madqn/) -> the madqn modules its files may import
ALLOWED = {
    "core": {"madqn.core"},
    "envs": {"madqn.envs", "madqn.config", "madqn.errors"},
    "training": LOWER,
    "evaluation": LOWER | {"madqn.evaluation"},
    "bench": LOWER | {"madqn.bench"},
    "cli": LOWER | {"madqn.cli", "madqn.evaluation", "madqn.bench", "madqn.api", "madqn.commands"},
    "config": {"madqn.errors"},
    "errors": set(),
    "commands": set(),  # the printed follow-up commands: plain strings, below everything that prints them
    "api": LOWER | {"madqn.evaluation", "madqn.commands"},
    "runner": {"madqn.training"},  # deprecated alias
    "__init__": LOWER | {"madqn.evaluation", "madqn.api"},  # import madqn: no command line, no benchmarks
    "__main__": {"madqn.cli"},  # python -m madqn: the only way in from outside the CLI
}
# single files allowed more than their part: `madqn compare` trains its runs through madqn.train
EXCEPTIONS = {"evaluation/compare.py": {"madqn.api"}}


def part_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def madqn_imports(path: Path, modules: set[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, module) for every madqn module a file imports, at any depth (in functions too): ``from madqn.x
    import y`` is madqn.x.y when that is one of ``modules``, else madqn.x (``from madqn import x`` -> madqn.x)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "madqn"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "madqn":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.append((node.lineno, sub if sub in modules or node.module == "madqn" else node.module))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}:{node.lineno}: relative import; madqn imports absolutely")
    return found


def allowed(module: str, prefixes: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the madqn modules importing it runs: those it imports by name (at module level and inside
    functions) and the packages around them that Python imports first (``madqn.cli.summary`` runs
    ``madqn/cli/__init__.py``), except the packages it lies in itself (already being imported: a package's
    ``__init__`` may import its own modules)."""
    files = {module_name(p, package): p for p in package.rglob("*.py")}
    graph = {}
    for m, p in files.items():
        edges = set()
        for _, target in madqn_imports(p, set(files)):
            parts = target.split(".")
            for n in range(1, len(parts) + 1):
                name = ".".join(parts[:n])
                if name in files and name != m and not m.startswith(name + "."):
                    edges.add(name)
        graph[m] = edges
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A list of modules that import each other around a loop (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(f) for f in FILES}


def test_every_part_of_madqn_has_rules():
    assert {part_of(f) for f in FILES} == set(ALLOWED)


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_imports_follow_the_layers(part):
    files = [f for f in FILES if part_of(f) == part]
    assert files
    wrong = []
    for f in files:
        rules = ALLOWED[part] | EXCEPTIONS.get(str(f.relative_to(PACKAGE)), set())
        wrong += [f"{f.relative_to(PACKAGE.parent)}:{line} imports {module}"
                  for line, module in madqn_imports(f, MODULES) if not allowed(module, rules)]
    assert not wrong, "\n".join(wrong)


def test_no_import_circle_between_any_two_modules():
    graph = import_graph()
    assert len(graph) == len(FILES) and sum(map(len, graph.values())) > 100
    assert find_circle(graph) is None, " -> ".join(find_circle(graph))


def test_import_madqn_loads_no_command_line_and_no_benchmarks():
    code = ("import sys, madqn; loaded = sorted(m for m in sys.modules if m.startswith(('madqn.cli', 'madqn.bench')));"
            "print(madqn.train.__module__, loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.split() == ["madqn.api", "[]"]


def test_runner_is_a_deprecated_alias_that_says_what_to_import():
    sys.modules.pop("madqn.runner", None)
    with pytest.warns(DeprecationWarning, match="import Hook, Trainer and EpisodeRecord from madqn"):
        runner = importlib.import_module("madqn.runner")
    import madqn

    assert (runner.Hook, runner.Trainer, runner.EpisodeRecord) == (madqn.Hook, madqn.Trainer, madqn.EpisodeRecord)


def test_the_checkers_see_every_import_form_and_every_circle(tmp_path):
    """The checkers themselves: each way of importing a madqn module is found, and a loop through a
    function-local import is a circle."""
    source = tmp_path / "x.py"
    source.write_text("import madqn.training.trainer\nfrom madqn import api\nfrom madqn.core.replay import ReplayMemory\n"
                      "def f():\n    from madqn.evaluation import agents\nimport numpy\n")
    assert madqn_imports(source, MODULES) == [(1, "madqn.training.trainer"), (2, "madqn.api"),
                                              (3, "madqn.core.replay"), (5, "madqn.evaluation.agents")]
    assert not allowed("madqn.evaluation.agents", ALLOWED["training"]) and allowed("madqn.core.replay",
                                                                                    ALLOWED["training"])
    package = tmp_path / "madqn"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from madqn.sub import a\n")  # a package importing its module
    (package / "sub" / "a.py").write_text("from madqn.sub.b import g\n")
    (package / "sub" / "b.py").write_text("def g():\n    from madqn.sub import c\n")
    (package / "sub" / "c.py").write_text("x = 1\n")
    (package / "d.py").write_text("x = 1\n")
    graph = import_graph(package)
    assert graph == {"madqn": set(), "madqn.sub": {"madqn.sub.a"}, "madqn.sub.a": {"madqn.sub.b"},
                     "madqn.sub.b": {"madqn.sub.c"}, "madqn.sub.c": set(), "madqn.d": set()}
    assert find_circle(graph) is None
    (package / "sub" / "c.py").write_text("def h():\n    import madqn.sub.a\n")
    assert find_circle(import_graph(package)) == ["madqn.sub.a", "madqn.sub.b", "madqn.sub.c", "madqn.sub.a"]
    # importing a module runs its package's __init__ first: d -> sub.c runs sub, which imports a -> b -> c -> d
    (package / "sub" / "c.py").write_text("x = 1\n")
    (package / "d.py").write_text("from madqn.sub.c import x\n")
    (package / "sub" / "b.py").write_text("import madqn.d\n")
    assert find_circle(import_graph(package)) == ["madqn.d", "madqn.sub", "madqn.sub.a", "madqn.sub.b", "madqn.d"]
