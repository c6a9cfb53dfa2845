"""The layering the code promises, checked from the source: the six concept files hold the method and import one
way (README, "The files"); infra/ holds the machinery and never imports a concept file; the toy world and its study
(toyworld/) sit on top, and neither the six files nor infra/ import it but through its one hook
(toyworld/toy_hooks.py); and every file stays a size a reader can hold in one sitting."""
import ast
import glob
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONCEPT = ("tasks", "workflows", "policies", "grpo", "train", "eval")


def modules_in(folder: str) -> tuple[str, ...]:
    return tuple(sorted(f"{folder}.{os.path.basename(p)[:-3]}" for p in glob.glob(os.path.join(ROOT, folder, "*.py"))
                        if not p.endswith("__init__.py")))


INFRA, TOYWORLD = modules_in("infra"), modules_in("toyworld")
HOOK = "toyworld.toy_hooks"  # the toy world's one way in: its model, its regime, its tallies, calibrate
ALLOWED = {  # concept file -> the project modules it may import (data flows one way: no cycles)
    "tasks": {"infra.data", "infra.sandbox"},
    "workflows": {"tasks", "infra.tallies", "infra.roles", "infra.settings"},  # engine, routing, encoding passed in
    "policies": {"infra.models", "infra.roles", "infra.memory", "infra.decoding", "infra.decode_shapes",
                 "infra.vllm_engine", HOOK},  # the engines (make_engine); no workflow or GRPO code
    "grpo": {"policies", "infra.distributed", "infra.update_report", "infra.settings"},
    "eval": {"tasks", "workflows", "policies", "grpo", *INFRA, HOOK},   # never train
    "train": {"tasks", "workflows", "policies", "grpo", "eval", *INFRA, HOOK},
}
CONCEPT_MAX_LINES, CONCEPT_TOTAL_LINES, INFRA_MAX_LINES, FUNCTION_MAX_LINES = 560, 2800, 400, 60  # the design card
MAX_COLUMNS = 100  # the anchors write few lines past 100 columns; the six files, infra/ and toyworld/ none


def path_of(module: str, root: str = ROOT) -> str:
    return os.path.join(root, *module.split(".")) + ".py"


def project_imports(module: str, root: str = ROOT) -> set[str]:
    """The project modules a file imports, anywhere in it (top level or inside functions): concept files by name,
    infra and toyworld modules as `infra.<name>` (`from infra import cells` and `from infra.cells import X`
    alike)."""
    with open(path_of(module, root)) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            packages = ("infra", "toyworld")
            found |= {f"{node.module}.{alias.name}" for alias in node.names} if node.module in packages else set()
    return {name for name in found if name in CONCEPT or name in INFRA or name in TOYWORLD}


@pytest.mark.parametrize("module", CONCEPT)
def test_concept_files_import_one_way(module):
    extra = project_imports(module) - ALLOWED[module]
    assert not extra, f"{module}.py imports {extra}"


@pytest.mark.parametrize("module", INFRA)
def test_infra_never_imports_a_concept_file(module):
    upward = project_imports(module) & set(CONCEPT)
    assert not upward, f"{module} imports the concept files {upward}"


@pytest.mark.parametrize("module", CONCEPT + INFRA)
def test_only_the_hook_reaches_the_toy_world(module):
    """The six files and infra/ import nothing of toyworld/ but its hook: the toy world is a study built on the
    method, not part of it."""
    toy = project_imports(module) & set(TOYWORLD)
    assert toy <= {HOOK}, f"{module} imports {toy - {HOOK}} (only {HOOK} may be imported)"


def test_imports_have_no_cycle():
    graph = {m: project_imports(m) & set(INFRA + TOYWORLD) for m in INFRA + TOYWORLD}
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"import cycle: {' -> '.join(path + (m,))}"
        if m not in done:
            for n in graph[m]:
                visit(n, path + (m,))
            done.add(m)
    for m in INFRA + TOYWORLD:
        visit(m, ())


def test_the_checks_catch_a_forbidden_import(tmp_path):
    """The rules are not vacuous: a workflows.py that imports policies inside a function, an infra module that
    imports a concept file, and one that imports the toy world past its hook, are all caught."""
    with open(path_of("workflows")) as f:
        source = f.read()
    (tmp_path / "workflows.py").write_text(source + "\n\ndef late():\n    from policies import route_adapter\n")
    assert project_imports("workflows", str(tmp_path)) - ALLOWED["workflows"] == {"policies"}
    (tmp_path / "infra").mkdir()
    with open(path_of("infra.checkpoints")) as f:
        source = f.read()
    (tmp_path / "infra" / "checkpoints.py").write_text(source + "\nimport grpo\n")
    assert project_imports("infra.checkpoints", str(tmp_path)) & set(CONCEPT) == {"grpo"}
    (tmp_path / "infra" / "plots.py").write_text("def late():\n    from toyworld import toy_hooks, study\n")
    assert project_imports("infra.plots", str(tmp_path)) & set(TOYWORLD) == {HOOK, "toyworld.study"}


def file_facts(module: str) -> tuple[str, int, list[tuple[str, int]]]:
    with open(path_of(module)) as f:
        source = f.read()
    functions = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    sizes = [(n.name, n.end_lineno - n.lineno + 1) for n in functions]
    long = [(name, size) for name, size in sizes if size > FUNCTION_MAX_LINES]
    return source, source.count("\n"), long


@pytest.mark.parametrize("module", CONCEPT + INFRA + TOYWORLD + ("infra.__init__", "toyworld.__init__"))
def test_files_and_functions_stay_readable(module):
    source, lines, long = file_facts(module)
    assert source.startswith('"""'), f"{module} opens without a docstring"
    assert "shared/" not in source, f"{module} points outside the repository"
    limit = CONCEPT_MAX_LINES if module in CONCEPT else None if module == "infra.sandbox" else INFRA_MAX_LINES
    assert limit is None or lines <= limit, f"{module} has {lines} lines (at most {limit})"
    assert not long, f"{module}: functions over {FUNCTION_MAX_LINES} lines: {long}"
    wide = [i for i, line in enumerate(source.split("\n"), 1) if len(line) > MAX_COLUMNS]
    assert not wide, f"{module}: lines past {MAX_COLUMNS} columns: {wide}"


def test_the_method_fits_in_one_sitting():
    total = sum(file_facts(m)[1] for m in CONCEPT)
    assert total <= CONCEPT_TOTAL_LINES, f"the six concept files have {total} lines (at most {CONCEPT_TOTAL_LINES})"


def test_the_top_level_is_the_design_card():
    """Top level: the six concept files, infra/, toyworld/, and what every project has; anything else needs a
    reason. Read from git's index, so a user's runs/ or plots/ do not count."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if files.returncode != 0:
        pytest.skip("not a git checkout")
    allowed = {*(f"{m}.py" for m in CONCEPT), "infra", "toyworld", "tests", "bench", "docs", "README.md",
               "requirements.txt", "pyproject.toml", ".ci", ".gitignore"}
    extra = {path.split("/")[0] for path in files.stdout.splitlines()} - allowed
    assert not extra, f"top-level entries outside the design card: {sorted(extra)}"
