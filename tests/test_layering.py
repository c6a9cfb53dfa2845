"""The layering the code promises, checked from the source: which project module imports which, and the sizes a
reader can hold in one sitting (files at most 600 lines, functions at most 60)."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ("sandbox", "tasks", "workflows", "policies", "grpo", "train", "eval")
ALLOWED = {  # module -> the project modules it may import (data flows one way)
    "sandbox": set(),                                        # runs programs against tests; knows no Task
    "tasks": {"sandbox"},
    "workflows": {"tasks"},                                   # the engine, routing and encoding are passed in
    "policies": set(),                                        # no workflow or GRPO code
    "grpo": {"policies"},
    "eval": {"grpo", "policies", "tasks", "workflows"},       # never train
    "train": {"eval", "grpo", "policies", "tasks", "workflows"},
}


def project_imports(module: str, root: str = ROOT) -> set[str]:
    """The project modules a file imports, anywhere in it (top level or inside functions)."""
    with open(os.path.join(root, f"{module}.py")) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_imports_follow_the_layering(module):
    extra = project_imports(module) - ALLOWED[module]
    assert not extra, f"{module}.py imports {extra}"


def test_the_check_catches_a_forbidden_import(tmp_path):
    """The rule is not vacuous: a workflows.py that imports policies, even inside a function, is caught."""
    with open(os.path.join(ROOT, "workflows.py")) as f:
        source = f.read()
    (tmp_path / "workflows.py").write_text(source + "\n\ndef late():\n    from policies import route_adapter\n")
    assert project_imports("workflows", str(tmp_path)) == {"tasks", "policies"} > ALLOWED["workflows"]


@pytest.mark.parametrize("module", MODULES)
def test_files_and_functions_stay_readable(module):
    with open(os.path.join(ROOT, f"{module}.py")) as f:
        source = f.read()
    assert source.startswith('"""'), f"{module}.py opens without a docstring"
    assert "shared/" not in source, f"{module}.py points outside the repository"
    if module != "sandbox":  # the six concept files
        assert source.count("\n") <= 600, f"{module}.py has {source.count(chr(10))} lines"
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert not long, f"{module}.py: functions over 60 lines: {long}"
