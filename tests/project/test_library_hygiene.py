"""lcp_sandbox behaves as a library: importing it (or running its command line)
does not import lollms_client, nothing reaches stderr unless the host configured
logging, and the public surface documents itself."""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import LIBS, REPO


def run_python(code: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


def test_importing_the_binding_and_the_cli_does_not_import_lollms_client(tmp_path):
    p = run_python("""
        import importlib.util, json, sys
        import lcp_sandbox.binding.binding, lcp_sandbox.fronts.cli
        after_import = sorted(m for m in sys.modules if m.split(".")[0] == "lollms_client")
        from lcp_sandbox import SandboxedBinding
        with SandboxedBinding(tools_folders=[sys.argv[1]], workspace=sys.argv[2]) as b:
            out = b.execute_tool("tool_increment", {"step": 2})
        lcp_sandbox.fronts.cli.main(["tools", sys.argv[1]])
        print(json.dumps({"installed": importlib.util.find_spec("lollms_client") is not None,
                          "after_import": after_import, "out": out, "type": type(b).__module__,
                          "after_use": sorted(m for m in sys.modules if m.split(".")[0] == "lollms_client")}))
        """, str(LIBS), str(tmp_path))
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["installed"] is True                     # it could have been imported: the test means something
    assert result["after_import"] == [] and result["after_use"] == []
    assert result["out"]["output"] == 2 and result["type"] == "lcp_sandbox.binding.binding"


def test_a_binding_made_after_lollms_is_imported_is_a_lollms_tool_binding(tmp_path):
    p = run_python("""
        import sys
        from lollms_client.lollms_tools_binding import LollmsToolBinding
        from lcp_sandbox import SandboxedBinding
        with SandboxedBinding(tools_folders=[sys.argv[1]], workspace=sys.argv[2]) as b:
            specs = b.to_chat_tool_specs()
            print(isinstance(b, LollmsToolBinding), isinstance(b, SandboxedBinding),
                  specs["tool_increment"]["callable"](step=3)["output"])
        """, str(LIBS), str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "True", "3"]


def test_crashes_and_timeouts_print_nothing_when_the_host_configured_no_logging(tmp_path):
    """Results carry the failure; the warnings go to the lcp_sandbox logger, whose
    NullHandler keeps Python's last-resort handler from printing them."""
    p = run_python("""
        import sys
        from lcp_sandbox import SandboxedBinding
        config = {"faults": {"sandbox": {"grace_s": 0.2}}}
        with SandboxedBinding(tools_folders=[sys.argv[1]], workspace=sys.argv[2], timeout_s=1,
                              host_tool_configs=config) as b:
            print(b.execute_tool("tool_segfault", {})["status_code"])
            print(b.execute_tool("tool_stubborn", {"seconds": 5})["status_code"])
            print(b.execute_tool("tool_print_flood", {"mb": 1})["status_code"])
            print(b.execute_tool("tool_fail", {})["status_code"])
        """, str(LIBS), str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["500", "504", "200", "500"]
    assert p.stderr == ""


def test_the_package_logger_has_a_null_handler_and_the_host_still_gets_records(tmp_path):
    p = run_python("""
        import logging, sys
        import lcp_sandbox
        handlers = logging.getLogger("lcp_sandbox").handlers
        print(any(isinstance(h, logging.NullHandler) for h in handlers))
        logging.basicConfig(level=logging.WARNING, format="HOST %(name)s %(message)s")
        with lcp_sandbox.SandboxedBinding(tools_folders=[sys.argv[1]], workspace=sys.argv[2]) as b:
            b.execute_tool("tool_segfault", {})
        """, str(LIBS), str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True"]
    assert "HOST lcp_sandbox" in p.stderr and "SIGSEGV" in p.stderr


# ================================================================ help() is useful
def _members(cls):
    for name, obj in vars(cls).items():
        fn = obj.fget if isinstance(obj, property) else obj
        if callable(fn) or isinstance(obj, property):
            yield name, fn


def test_the_class_docstring_describes_every_constructor_keyword():
    import inspect

    from lcp_sandbox import SandboxedBinding
    doc = inspect.getdoc(SandboxedBinding)
    params = [p for p in inspect.signature(SandboxedBinding.__init__).parameters.values()
              if p.name != "self" and p.kind is not p.VAR_KEYWORD]
    assert len(params) == 14
    for p in params:
        assert f"\n{p.name}\n    " in doc, p.name
    assert "\nother keywords\n    " in doc                        # **kwargs: the load flags
    assert str(inspect.signature(SandboxedBinding)).startswith("(host_tool_configs")   # not (*args, **kwargs)


def test_public_methods_have_docstrings_and_no_comment_shows_as_one():
    """pydoc shows the comment block right above a def that has no docstring
    (``# ---- discovery`` would become the method's help)."""
    import inspect
    import pydoc

    from lcp_sandbox.backends.local.supervisor import Supervisor
    from lcp_sandbox.binding import binding
    from lcp_sandbox.binding.binding import SandboxedBinding
    from lcp_sandbox.binding.lcp_surface import LcpSurface
    from lcp_sandbox.binding.tool_catalog import LibraryHandle
    from lcp_sandbox.core import discovery
    from lcp_sandbox.fronts import cli
    for cls in (SandboxedBinding, LcpSurface):             # LcpSurface: the rest of its surface
        for name, fn in _members(cls):
            if not name.startswith("_") or name in ("__enter__", "__exit__"):
                assert inspect.getdoc(fn), f"SandboxedBinding.{name} has no docstring"
    for name in ("start", "stop", "stats", "pool_stats", "close", "run"):
        assert inspect.getdoc(getattr(Supervisor, name)), f"Supervisor.{name} has no docstring"
    for cls in (SandboxedBinding, LcpSurface, LibraryHandle, Supervisor):
        for name, fn in _members(cls):
            if pydoc.visiblename(name, obj=cls):                 # what help() shows
                assert not (pydoc.getdoc(fn) or "").lstrip().startswith("#"), f"{cls.__name__}.{name}"
    for module in (binding, cli, discovery):
        for name, fn in vars(module).items():
            if inspect.isfunction(fn) and fn.__module__ == module.__name__ and pydoc.visiblename(name):
                assert not (pydoc.getdoc(fn) or "").lstrip().startswith("#"), f"{module.__name__}.{name}"
                assert inspect.getdoc(fn), f"{module.__name__}.{name} has no docstring"


# ================================================================ packaging
def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:                                   # Python 3.10
        import pytest
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_py_typed_and_the_license_ship_with_the_package():
    import lcp_sandbox
    config = _pyproject()
    assert (Path(lcp_sandbox.__file__).parent / "py.typed").is_file()
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["lcp_sandbox"]
    assert config["project"]["license"] == "Apache-2.0" and config["project"]["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 190


def test_the_version_has_one_source():
    import importlib.metadata

    import lcp_sandbox
    config = _pyproject()
    assert "version" not in config["project"] and "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lcp_sandbox.__version__"}
    assert importlib.metadata.version("lcp-sandbox") == lcp_sandbox.__version__


def test_metadata_names_what_exists_and_nothing_else():
    project = _pyproject()["project"]
    assert project["requires-python"] == ">=3.10"
    assert "Typing :: Typed" in project["classifiers"]
    assert "Operating System :: POSIX :: Linux" in project["classifiers"]
    assert project["urls"] == {"LCP format": "https://github.com/ParisNeo/lollms_client"}


def test_multiprocess_is_neither_declared_nor_imported():
    project = _pyproject()["project"]
    assert not any(re.match(r"multiprocess\b", d) for d in project["dependencies"])
    pattern = re.compile(r"^\s*(import|from)\s+multiprocess\b", re.MULTILINE)
    for folder in ("lcp_sandbox", "tools", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            assert not pattern.search(path.read_text(encoding="utf-8")), path


def test_ci_uses_a_venv_of_its_own():
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    script = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    assert "venv=.ci/venv" in script and 'rm -rf "$venv"' in script
    assert not re.search(r"(^|[\s\"'/])\.venv\b", script), script          # the developer's .venv is not touched
    assert ".ci/venv/" in (REPO / ".gitignore").read_text(encoding="utf-8").split()
