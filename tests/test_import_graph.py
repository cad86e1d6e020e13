"""The layering of ssl_engine, read from the source with ``ast`` (nothing is imported).

Every ``import`` and ``from ... import`` statement naming an ssl_engine module is an edge,
wherever it stands: at module level or inside a function, since a function-level import closes
a circle just as well, only later. ``from pkg import name`` is an edge to ``pkg.name`` when that
is a module, else to ``pkg``; an import of a name that is not a module resolves to the closest
enclosing module.

A package's ``__init__`` is a module like any other: its imports of its own submodules (to
re-export names or to register built-in components) are edges too. So a submodule must not
import its own package's ``__init__`` (e.g. ``from ssl_engine.engines import register_engine``
inside ``ssl_engine/engines/train.py``): that circle only works while the ``__init__`` happens
to define the name before it imports the submodule. Registries therefore live in their own
``registry`` modules, which both the ``__init__`` and the components import. What is not counted
is the implicit run of parent packages that importing ``a.b.c`` sets off (``a`` and ``a.b``
first): that is how Python imports any submodule, not a dependency the code chose.
"""
import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "ssl_engine"
SCRIPT_FOLDERS = ("extra_scripts", "tools", "benchmarks")  # run as python <folder>/<name>.py
EVALUATION_MAY_IMPORT = ("ssl_engine.data", "ssl_engine.utils", "ssl_engine.evaluation")


def module_files() -> Dict[str, Path]:
    """{dotted module name: file} of every module of ssl_engine (packages by their name)."""
    modules = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def closest_module(name: str, modules) -> Optional[str]:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_modules(name: str, path: Path, modules) -> Set[str]:
    """The ssl_engine modules ``name`` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package holding this module
                base = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "ssl_engine" or target.startswith("ssl_engine."):
                found.add(closest_module(target, modules))
    found.discard(name)
    return found


def import_graph() -> Dict[str, Set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import circle of ``graph`` as [a, b, ..., a], or None (iterative depth-first)."""
    state = {}  # 1: on the current path, 2: finished
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_graph_reader_sees_function_level_and_relative_imports(tmp_path):
    """The reader finds what the checks rely on: imports inside functions, relative imports,
    ``from pkg import module`` and names resolved to their module."""
    modules = {"ssl_engine.a", "ssl_engine.a.b", "ssl_engine.c"}
    source = tmp_path / "b.py"
    source.write_text("import os\nfrom . import b\n"
                      "def f():\n    from ssl_engine.c import thing\n"
                      "    from ssl_engine.a import b\n")
    assert imported_modules("ssl_engine.a.x", source, modules) == {"ssl_engine.a.b",
                                                                  "ssl_engine.c"}
    assert find_cycle({"p": {"q"}, "q": {"r"}, "r": {"p"}}) == ["p", "q", "r", "p"]
    assert find_cycle({"p": {"q"}, "q": set(), "r": {"p", "q"}}) is None


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50  # the whole package was read
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_evaluation_imports_only_data_utils_and_itself():
    """ssl_engine.evaluation computes on features and data: it starts no engine, builds no
    trainer or hook, so the engines, trainer and hooks can use it freely."""
    graph = import_graph()
    evaluation = {name: deps for name, deps in graph.items()
                  if name == "ssl_engine.evaluation" or name.startswith("ssl_engine.evaluation.")}
    assert "ssl_engine.evaluation.labelled_features" in evaluation
    wrong = {f"{name} imports {dep}" for name, deps in evaluation.items() for dep in deps
             if not any(dep == allowed or dep.startswith(allowed + ".")
                        for allowed in EVALUATION_MAY_IMPORT)}
    assert not wrong, sorted(wrong)


CHECKPOINT_MAY_IMPORT = ("ssl_engine.utils", "ssl_engine.models", "ssl_engine.checkpoint")


def test_checkpoint_imports_only_utils_models_and_itself():
    """ssl_engine.checkpoint reads and writes files and model states: the hook, the trainer and
    the engines call it, and it imports none of them (nor the config); the models below it do
    not import it."""
    graph = import_graph()
    checkpoint = {name: deps for name, deps in graph.items()
                  if name == "ssl_engine.checkpoint" or name.startswith("ssl_engine.checkpoint.")}
    assert "ssl_engine.checkpoint.io" in checkpoint
    wrong = {f"{name} imports {dep}" for name, deps in checkpoint.items() for dep in deps
             if not any(dep == allowed or dep.startswith(allowed + ".")
                        for allowed in CHECKPOINT_MAY_IMPORT)}
    wrong |= {f"{name} imports {dep}" for name, deps in graph.items()
              if name.split(".")[:2] in (["ssl_engine", "models"], ["ssl_engine", "utils"])
              for dep in deps if dep.startswith("ssl_engine.checkpoint")}
    assert not wrong, sorted(wrong)


# Lowest first; a module may import its own layer and the layers below it. Packages of one
# layer are peers and may import each other only where no cycle forms (the cycle test).
LAYERS = (
    ("utils",),
    ("data", "models", "meters"),
    ("optimizers", "evaluation", "checkpoint", "report"),
    ("config",),
    ("hooks",),
    ("losses",),
    ("trainer",),
    ("extraction",),
    ("engines",),
    ("cli",),  # the ssl-engine command (ssl_engine/cli.py): runs the engines and tools
)
MAX_FUNCTION_LEVEL_IMPORTS = 3  # classy_vision's trunks, loaded only when one is used
LAYER_OF = {package: level for level, packages in enumerate(LAYERS) for package in packages}


def package_of(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_every_package_has_a_layer():
    packages = {package_of(name) for name in module_files()} - {""}
    assert packages == set(LAYER_OF), "give a new package its place in LAYERS"


def test_no_module_imports_a_higher_layer():
    """utils < data, models, meters < optimizers, evaluation, checkpoint, report < config < hooks
    < losses < trainer < extraction < engines < cli: a lower layer never imports a higher one, so
    each layer can be read, tested and reused without what is built on top of it."""
    upward = sorted(f"{name} imports {dep}" for name, deps in import_graph().items()
                    if package_of(name) for dep in deps
                    if package_of(dep) and LAYER_OF[package_of(dep)] > LAYER_OF[package_of(name)])
    assert not upward, upward


def function_level_imports(path: Path):
    """(line number, source line and the line above) of every import of an ssl_engine module
    inside a function of ``path``."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            names = ([alias.name for alias in inner.names] if isinstance(inner, ast.Import)
                     else [inner.module or "."] if isinstance(inner, ast.ImportFrom) and
                     not inner.level else ["ssl_engine"] if isinstance(inner, ast.ImportFrom)
                     else [])
            if any(n == "ssl_engine" or n.startswith("ssl_engine.") for n in names):
                found.append((inner.lineno, lines[inner.lineno - 1], lines[inner.lineno - 2]))
    return sorted(set(found))


def test_function_level_imports_are_few_and_say_why():
    """An ssl_engine import inside a function hides a dependency from a reader of the module's
    top; the few that must stay (an optional heavy dependency, a registry filled on first use,
    a cycle) say why in a comment on the line or the line above."""
    found = {f"{path.relative_to(PACKAGE_ROOT)}:{line}": (text, above)
             for path in sorted(PACKAGE_ROOT.rglob("*.py"))
             for line, text, above in function_level_imports(path)}
    unexplained = sorted(where for where, (text, above) in found.items()
                         if "#" not in text and not above.strip().startswith("#"))
    assert not unexplained, unexplained
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, sorted(found)


def test_no_module_over_400_lines():
    long = sorted(f"{path.relative_to(PACKAGE_ROOT)}: {n}" for path in PACKAGE_ROOT.rglob("*.py")
                  if (n := len(path.read_text().splitlines())) > 400)
    assert not long, long


def script_files() -> Dict[str, Path]:
    """{``folder.name``: file} of every script of extra_scripts, tools and benchmarks."""
    return {f"{folder}.{path.stem}": path for folder in SCRIPT_FOLDERS
            for path in sorted((PACKAGE_ROOT.parent / folder).glob("*.py"))}


def script_imports(name: str, path: Path, modules, scripts) -> Set[str]:
    """The ssl_engine modules a script imports, and the scripts of its own folder it imports
    by name (``python folder/x.py`` puts the folder first on the import path), anywhere in its
    source."""
    folder = name.partition(".")[0]
    found = imported_modules(name, path, modules)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            tops = [alias.name.partition(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            tops = [node.module.partition(".")[0]]
        else:
            continue
        found |= {f"{folder}.{top}" for top in tops if f"{folder}.{top}" in scripts}
    found.discard(name)
    return found


def whole_graph() -> Dict[str, Set[str]]:
    """ssl_engine's import graph and the scripts' imports of it and of each other."""
    modules, scripts = module_files(), script_files()
    graph = import_graph()
    graph.update({name: script_imports(name, path, modules, scripts)
                  for name, path in scripts.items()})
    return graph


def is_sys_path(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path"
            and isinstance(node.value, ast.Name) and node.value.id == "sys")


def import_path_additions(path: Path) -> List[int]:
    """The lines of ``path`` that add to the import path: ``sys.path.insert/append/extend``,
    ``sys.path +=``, ``site.addsitedir`` (a process taking over its launcher's path whole,
    ``sys.path[:] = ...``, adds nothing)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        call = node.func if isinstance(node, ast.Call) else None
        if (isinstance(call, ast.Attribute) and call.attr in ("insert", "append", "extend")
                and is_sys_path(call.value)) or \
                (isinstance(call, ast.Attribute) and call.attr == "addsitedir") or \
                (isinstance(node, ast.AugAssign) and is_sys_path(node.target)):
            lines.append(node.lineno)
    return sorted(lines)


def test_script_reader_sees_sibling_imports_and_path_additions(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("import sys\nimport os.path\nfrom sib import f\n"
                      "def g():\n    import ssl_engine.c\n    sys.path.insert(0, 'a')\n"
                      "sys.path += ['b']\nsys.path[:] = list(sys.path)\n")
    scripts = {"tools.x", "tools.sib", "tools.os"}
    assert script_imports("tools.x", source, {"ssl_engine.c"}, scripts) == {
        "tools.sib", "tools.os", "ssl_engine.c"}
    assert import_path_additions(source) == [6, 7]


def test_no_import_cycles_with_the_scripts():
    """extra_scripts, tools and benchmarks import ssl_engine and the scripts beside them
    without a circle: what two scripts share lives in a third that imports neither."""
    graph = whole_graph()
    assert "extra_scripts.vissl_config_coverage" in graph and "tools.report" in graph
    assert "extra_scripts.vissl_common" in graph["extra_scripts.vissl_config_run"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_module_or_script_adds_to_the_import_path():
    """Scripts run with the package installed (``pip install -e .``) and find the scripts of
    their own folder as Python finds them; nothing adds to ``sys.path``."""
    files = [*sorted(PACKAGE_ROOT.rglob("*.py")), *script_files().values()]
    found = [f"{path.relative_to(PACKAGE_ROOT.parent)}:{line}" for path in files
             for line in import_path_additions(path)]
    assert not found, found
