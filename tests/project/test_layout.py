"""The layout is the architecture: checked by reading the imports (AST), not by running.

The package is a house of floors, top to bottom; each floor imports only the
floors below it (or its own), and no module imports another that leads back to
it, counting imports inside functions:

    the package (__init__, testing)     the public API, imported lazily; test hooks
    fronts/, lollms_bindings/           CLI, MCP server, the lollms subclass
    binding/                            SandboxedBinding: the LCP surface
    backends/                           the local supervisor and its processes; Ray
    worker/                             the worker's loop, confinement, the zygote
    system/                             what the operating system tells (read only)
    core/                               pure: no processes
    protocol/                           the wire both sides share

Besides the order: the host side (backends/ and above) never imports worker/
(the zygote is started as a fresh interpreter that imports it, and the worker
side must stay lean); core/ imports no process, thread, socket or system-call
module; modules and functions stay small enough to read at once.
"""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from conftest import REPO

PKG = REPO / "lcp_sandbox"

FLOORS = [("package", {"__init__", "testing"}), ("fronts", {"fronts", "lollms_bindings"}),
          ("binding", {"binding"}), ("backends", {"backends"}), ("worker", {"worker"}),
          ("system", {"system"}), ("core", {"core"}), ("protocol", {"protocol"})]
LEVEL = {room: i for i, (_, rooms) in enumerate(FLOORS) for room in rooms}
HOST_SIDE = {"package", "fronts", "binding", "backends"}
PROCESS_MODULES = {"subprocess", "multiprocessing", "signal", "socket", "select", "selectors", "threading",
                   "concurrent", "ctypes", "resource", "fcntl", "psutil", "asyncio"}
#: A module at most (comments stand on their own line above what they explain, not at the
#: ends of lines: that took the modules about 500 lines, 470 holds each of them), a function.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 470, 80
#: backends/local/supervisor.py holds the whole Supervisor, one class in one room, as
#: CPython's concurrent.futures.process holds its executor: a reader follows a call and
#: its failure top-down without visiting a file twice, so it may be longer than the others.
MAX_SUPERVISOR_LINES = 800


def modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        dotted = ".".join(("lcp_sandbox", *rel.with_suffix("").parts))
        yield path, rel, dotted.removesuffix(".__init__")


MODULES = {dotted: path for path, _, dotted in modules()}


def floor(name: str) -> int:
    """The floor of a module name of the package (the package itself: the top)."""
    parts = name.split(".")
    return LEVEL["__init__"] if len(parts) == 1 else LEVEL[parts[1]]


def floor_name(name: str) -> str:
    return FLOORS[floor(name)][0]


def imported(path: Path, dotted: str) -> set:
    """Modules of the package the file imports (anywhere in it), as the most
    precise module each import names: ``from .x import y`` is ``x.y`` when that
    is a module, else ``x``."""
    package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            subs = [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in MODULES]
            names = subs if len(subs) == len(node.names) else [name, *subs]
        else:
            continue
        out.update(n for n in names if n.split(".")[0] == "lcp_sandbox")
    return out


GRAPH = {dotted: imported(path, dotted) for path, _, dotted in modules()}


def test_every_module_is_on_a_floor():
    for _, rel, _ in modules():
        assert rel.parts[0].removesuffix(".py") in LEVEL, f"{rel}: put it on a floor ({[f for f, _ in FLOORS]})"


@pytest.mark.parametrize("path,rel,dotted", list(modules()), ids=lambda v: str(v) if isinstance(v, Path) else "")
def test_imports_go_down(path, rel, dotted):
    mine = floor(dotted)
    for name in GRAPH[dotted]:
        assert floor(name) >= mine, f"{rel} ({floor_name(dotted)}) imports {name} ({floor_name(name)}), above it"
        if floor_name(dotted) in HOST_SIDE:
            assert floor_name(name) != "worker", f"{rel} (host side) imports {name} (worker side)"
    if floor_name(dotted) == "core":
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                for name in [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]:
                    assert name.split(".")[0] not in PROCESS_MODULES, f"{rel} (pure) imports {name}"


def test_no_import_cycle():
    """Depth-first search over every import (function-level ones included); a module
    importing its own package's __init__ is not a cycle (Python loads it first)."""
    state: dict[str, int] = {}

    def visit(mod: str, trail: list) -> None:
        state[mod] = 1
        for dep in sorted(GRAPH.get(mod, ())):
            if dep not in GRAPH or mod.startswith(dep + "."):
                continue
            assert state.get(dep) != 1, "import cycle: " + " -> ".join(trail[trail.index(dep):] + [dep]) \
                if dep in trail else f"import cycle through {dep}"
            if dep not in state:
                visit(dep, trail + [dep])
        state[mod] = 2

    for mod in sorted(GRAPH):
        if mod not in state:
            visit(mod, [mod])


def test_the_lollms_front_is_the_only_module_that_imports_lollms_client():
    for path, rel, _ in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] == "lollms_client" for n in names):
                assert rel == Path("fronts/lollms_binding.py"), f"{rel} imports lollms_client"


def test_the_zygote_boots_from_the_worker_side():
    text = (PKG / "backends" / "local" / "zygote_client.py").read_text(encoding="utf-8")
    assert "from lcp_sandbox.worker.zygote import main" in text


def test_rooms_fit_their_job():
    for path, rel, _ in modules():
        lines = path.read_text(encoding="utf-8").splitlines()
        cap = MAX_SUPERVISOR_LINES if rel == Path("backends/local/supervisor.py") else MAX_MODULE_LINES
        assert len(lines) <= cap, f"{rel} has {len(lines)} lines (at most {cap})"
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                assert n <= MAX_FUNCTION_LINES, f"{rel}:{node.lineno} {node.name}() has {n} lines"


def test_no_environment_switch_turns_a_protection_off():
    for path, rel, _ in modules():
        assert "LCP_SANDBOX_DISABLE" not in path.read_text(encoding="utf-8"), rel


def test_the_package_never_edits_sys_path_of_the_host():
    """The worker side sets its own process's sys.path from INIT (the host's); the
    host side never edits its own."""
    for path, rel, dotted in modules():
        if floor_name(dotted) not in HOST_SIDE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("append", "insert", "extend") \
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "path" \
                    and isinstance(node.value.value, ast.Name) and node.value.value.id == "sys":
                raise AssertionError(f"{rel}:{node.lineno} edits sys.path")


def test_the_binding_uses_only_the_backend_interface():
    from lcp_sandbox import Supervisor
    from lcp_sandbox.backends.base import Backend
    assert isinstance(Supervisor(), Backend)
    allowed = {n for n in dir(Backend) if not n.startswith("_")} | {"confine"}
    for module in ("binding.py", "lcp_surface.py"):
        tree = ast.parse((PKG / "binding" / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "supervisor"):
                assert node.attr in allowed, f"{module} uses supervisor.{node.attr}, not in Backend"


def test_every_package_of_the_tree_is_in_the_wheel():
    """pyproject.toml lists the packages by name: a new folder of modules left out of it is
    missing from the wheel (the checkout's editable install would not show it)."""
    import tomllib
    with open(PKG.parent / "pyproject.toml", "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    tree = {".".join(p.parent.relative_to(PKG.parent).parts) for p in PKG.rglob("__init__.py")}
    assert tree - listed == set(), f"add to [tool.setuptools] packages: {sorted(tree - listed)}"


#: A file or folder path as texts name them (``backends/local/spin.py``, ``worker/confine/``).
NAMED_PATH = re.compile(r"(?<![\w./<-])((?:[A-Za-z_][\w-]*/)+[\w-]+\.(?:py|md|yaml|yml|toml|txt)"
                        r"|(?:[a-z_]+/)+(?=[\s),.;:`'\"]))")
#: Paths that stand for any library, not for a file of this repository.
EXAMPLE_PATHS = {"X/X.py", "folder/name.py", "folder/name/name.py"}


def named_paths(path: Path):
    """(line, path) for every path named in the file's comments and docstrings."""
    source = path.read_text(encoding="utf-8")
    texts = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                texts.append((node.body[0].lineno, doc))
    for line, text in texts:
        for match in NAMED_PATH.finditer(text):
            yield line, match.group(1)


def test_every_path_a_docstring_or_comment_names_exists():
    """A map that names a room that is gone sends the next reader nowhere. A path is
    taken relative to the file's own folder or any folder above it in the repository,
    or to the package."""
    repo = PKG.parent
    missing = []
    for top in (PKG, repo / "benchmarks", repo / "tests"):
        for path in sorted(top.rglob("*.py")):
            if "_libs" in path.parent.name or "corpus" in path.parts:
                continue
            for line, name in named_paths(path):
                bases = [p for p in path.parents if repo in (p, *p.parents)] + [PKG]
                if name not in EXAMPLE_PATHS and not any((b / name).exists() for b in bases):
                    missing.append(f"{path.relative_to(repo)}:{line} names {name}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


#: A line of a package's index: a module of it and what it holds (``    slot.py   a worker's slot``).
INDEX_LINE = re.compile(r"^ +(\w+\.py) +\S", re.MULTILINE)


def test_every_index_of_a_package_lists_each_of_its_modules():
    """A package whose __init__.py docstring has an index of its modules lists every one
    of them, and only those: a module left out is a room the map does not show."""
    wrong = []
    for init in sorted(PKG.rglob("__init__.py")):
        listed = set(INDEX_LINE.findall(ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")),
                                                          clean=False) or ""))
        if not listed:
            continue
        present = {p.name for p in init.parent.glob("*.py")} - {"__init__.py"}
        rel = init.relative_to(PKG)
        wrong += [f"{rel} does not list {name}" for name in sorted(present - listed)]
        wrong += [f"{rel} lists {name}, which is not in its package" for name in sorted(listed - present)]
    assert not wrong, "\n".join(wrong)


def test_the_supervisors_map_names_methods_that_exist():
    """supervisor.py opens with the walk of a call and of its failure through the methods
    of Supervisor (``_failed()``) and of the classes it imports (``WorkerProcess.exchange()``):
    a method renamed or removed must be renamed or removed there too."""
    from lcp_sandbox.backends.local import supervisor
    named = re.findall(r"\b(?:([A-Z]\w+)\.)?(\w+)\(\)", supervisor.__doc__ or "")
    assert named, "the map names no method"
    missing = [f"{owner}.{name}()" if owner else f"{name}()" for owner, name in named
               if not hasattr(getattr(supervisor, owner or "Supervisor", None), name)]
    assert not missing, f"supervisor.py's docstring names what does not exist: {missing}"


def test_every_failure_the_package_defines_is_in_the_tree_of_outcomes():
    """core/outcomes.py draws every exception class of the package and what a caller gets
    of it: a new one must be placed there."""
    tree = (PKG / "core" / "outcomes.py").read_text(encoding="utf-8").split('"""')[1]
    drawn = set(re.findall(r"^ *(?:[│├└─ ]*)([A-Z]\w+)", tree, re.MULTILINE))
    defined = set()
    for path, rel, _ in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name[0] != "_" and any(
                    isinstance(b, (ast.Name, ast.Attribute)) and
                    re.search(r"(Exception|Error|Event|Gone|Unavailable|_Said|Said)$",
                              ast.unparse(b)) for b in node.bases):
                defined.add((node.name, str(rel)))
    missing = sorted(f"{name} ({rel})" for name, rel in defined if name not in drawn)
    assert not missing, f"draw these in core/outcomes.py's tree of failures: {missing}"


def test_the_module_table_of_internals_is_what_the_docstrings_say():
    """docs/internals.md's module table is made from the modules' docstrings
    (tests/support/module_map.py): a module added, moved or removed fails here until it is remade."""
    from support import module_map
    table = module_map.page_table(module_map.PAGE.read_text(encoding="utf-8"))
    assert table is not None, f"docs/internals.md has lost its markers ({module_map.BEGIN})"
    assert table == module_map.render(), f"run `{module_map.COMMAND}` and commit docs/internals.md"
