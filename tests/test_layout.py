"""The package layout keeps the data path one-way: what each subpackage may import (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "madqn"
# subpackage -> the madqn modules and subpackages its files may import
ALLOWED = {
    "core": {"madqn.core"},
    "envs": {"madqn.envs", "madqn.config", "madqn.errors"},
    "training": {"madqn.training", "madqn.core", "madqn.envs", "madqn.config", "madqn.errors"},
}


def madqn_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every madqn module a file imports, at any depth (``from madqn import x`` -> madqn.x)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "madqn"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "madqn":
            if node.module == "madqn":
                found += [(node.lineno, f"madqn.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}:{node.lineno}: relative import; madqn imports absolutely")
    return found


def allowed(module: str, prefixes: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("subpackage", sorted(ALLOWED))
def test_subpackage_imports_follow_the_data_path(subpackage):
    files = sorted((PACKAGE / subpackage).glob("*.py"))
    assert len(files) > 2
    wrong = [f"{f.relative_to(PACKAGE.parent)}:{line} imports {module}" for f in files
             for line, module in madqn_imports(f) if not allowed(module, ALLOWED[subpackage])]
    assert not wrong, "\n".join(wrong)


def test_the_rule_sees_every_import_form(tmp_path):
    """The checker itself: each way of importing a madqn module is found."""
    source = tmp_path / "x.py"
    source.write_text("import madqn.training.trainer\nfrom madqn import api\nfrom madqn.core.replay import ReplayMemory\n"
                      "def f():\n    from madqn.evaluation import agents\nimport numpy\n")
    assert madqn_imports(source) == [(1, "madqn.training.trainer"), (2, "madqn.api"), (3, "madqn.core.replay"),
                                     (5, "madqn.evaluation")]
    assert not allowed("madqn.evaluation.agents", ALLOWED["training"]) and allowed("madqn.core.replay",
                                                                                    ALLOWED["training"])
