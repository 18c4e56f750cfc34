"""The layout is the architecture: checked by reading the imports (AST), not by running.

- host side (host/, backends/, fronts/, the package's __init__) never imports the
  worker side (worker/): the two meet through protocol/ and share core/ and proc.py;
- the worker side never imports the host side (the zygote, whose memory every
  worker starts from, must stay lean);
- core/ is pure: no process, thread, socket or system-call module, nothing of
  either side;
- every module has its place, and none grows past 400 lines.
"""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "lcp_sandbox"

SIDES = {"core": "pure", "protocol": "shared", "proc": "shared", "host": "host", "backends": "host",
         "fronts": "host", "__init__": "host", "worker": "worker", "lollms_bindings": "host"}
PROCESS_MODULES = {"subprocess", "multiprocessing", "signal", "socket", "select", "selectors", "threading",
                   "concurrent", "ctypes", "resource", "fcntl", "psutil", "asyncio"}


def modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        dotted = ".".join(("lcp_sandbox", *rel.with_suffix("").parts))
        yield path, rel, dotted.removesuffix(".__init__")


def side(rel: Path) -> str:
    return SIDES[rel.parts[0].removesuffix(".py")]


def imported(path: Path, dotted: str) -> set:
    """Absolute names of every module the file imports (anywhere in it)."""
    package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)     # "from . import x" imports x
    return out


def side_of(name: str):
    parts = name.split(".")
    if parts[0] != "lcp_sandbox" or len(parts) == 1:
        return None
    return SIDES.get(parts[1])


def test_every_module_has_a_side():
    for _, rel, _ in modules():
        assert rel.parts[0].removesuffix(".py") in SIDES, f"{rel}: put it in core/, host/, worker/, backends/ or fronts/"


@pytest.mark.parametrize("path,rel,dotted", list(modules()), ids=lambda v: str(v) if isinstance(v, Path) else "")
def test_no_import_crosses_the_line(path, rel, dotted):
    mine = side(rel)
    for name in imported(path, dotted):
        theirs = side_of(name)
        if mine == "host":
            assert theirs != "worker", f"{rel} (host side) imports {name} (worker side)"
        elif mine == "worker":
            assert theirs != "host", f"{rel} (worker side) imports {name} (host side)"
        elif mine in ("pure", "shared"):
            assert theirs in (None, "pure", "shared"), f"{rel} ({mine}) imports {name}"
        if mine == "pure":
            assert name.split(".")[0] not in PROCESS_MODULES, f"{rel} (pure) imports {name}"


def test_the_zygote_boots_from_the_worker_side():
    text = (PKG / "host" / "zygote.py").read_text(encoding="utf-8")
    assert "from lcp_sandbox.worker.zygote import main" in text


def test_no_module_over_400_lines():
    for path, rel, _ in modules():
        n = len(path.read_text(encoding="utf-8").splitlines())
        assert n <= 400, f"{rel} has {n} lines: split it by role"


def test_the_binding_uses_only_the_backend_interface():
    from lcp_sandbox import Supervisor
    from lcp_sandbox.backends.base import Backend
    assert isinstance(Supervisor(), Backend)
    allowed = {n for n in dir(Backend) if not n.startswith("_")} | {"confine"}
    for module in ("binding.py", "lcp_surface.py"):
        tree = ast.parse((PKG / "host" / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "supervisor"):
                assert node.attr in allowed, f"{module} uses supervisor.{node.attr}, not in Backend"
