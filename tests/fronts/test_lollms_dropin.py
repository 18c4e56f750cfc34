"""SandboxedBinding as a lollms_client tools binding: a drop-in for LCPBinding.

* with lollms_client installed, lollms finds it in
  ``lcp_sandbox.lollms_bindings_dir()`` as ``tools_binding_name="sandboxed"`` and
  gets a ``LollmsToolBinding`` subclass of ``SandboxedBinding``; a binding made
  in a process that imported lollms_client is one too,
  and lollms' own orchestration (``to_chat_tool_specs`` callables,
  ``execute_tool_call``) runs tools through it with a real ``LollmsClient``;
* the library-mounting helpers lollms' personalities and discussions call
  answer as upstream ``LCPBinding`` does, for the same sequence of calls,
  including office-family gating (``set_session_flags``) and
  ``TOOL_LIBRARY_LOAD_FLAG`` gating;
* without lollms_client (a ``python -S`` subprocess that cannot import it)
  the binding works and nothing imports lollms_client.

The one deliberate difference that shows here: a prompt provider
(``tool_execute_shell_command_prompt``) is not a tool in lcp_sandbox (see
docs/lollms.md), so it is left out of the comparisons.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO

import lcp_sandbox
from lcp_sandbox import SandboxedBinding

LIBS = FIXTURES / "libs"
LOLLMS_LIBS = FIXTURES / "lollms_libs"
PERSISTENT = "lollms_client.tools_bindings.lcp.persistent_"
PROVIDERS = {"tool_execute_shell_command_prompt"}
STUDIO = "tool_create_illustrated_audio_story"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(200)
WAV = b"RIFF----WAVEfmt " + bytes(40)


def _lollms():
    return pytest.importorskip("lollms_client")


def _lcp():
    return pytest.importorskip("lollms_client.tools_bindings.lcp")


def _default_tools() -> Path:
    spec = importlib.util.find_spec("lollms_client")
    if spec is None:
        pytest.skip("lollms_client is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "tools_bindings" / "lcp" / "default_tools"


@pytest.fixture
def empty_folder(tmp_path):
    folder = tmp_path / "own_tools"
    folder.mkdir()
    return folder


# ================================================================ a LollmsToolBinding
def test_sandboxed_binding_is_a_lollms_tool_binding(supervisor, tmp_path):
    _lollms()
    from lollms_client.lollms_tools_binding import LollmsToolBinding
    assert issubclass(lcp_sandbox.lollms_binding_class(), LollmsToolBinding)
    assert issubclass(lcp_sandbox.lollms_binding_class(), SandboxedBinding)
    with SandboxedBinding(tools_folders=[str(LIBS)], supervisor=supervisor, tenant="dropin-type",
                          workspace=str(tmp_path)) as b:
        assert isinstance(b, LollmsToolBinding)
        assert b.binding_name == "sandboxed"
        assert b.list_models() == []
        assert b.list_tools() == b.discover_tools()
        assert b.execute_tool("tool_increment", {"step": 2})["output"] == 2


def test_lollms_finds_the_bindings_folder():
    _lollms()
    from lollms_client.lollms_tools_binding import LollmsTOOLBindingManager
    folder = lcp_sandbox.lollms_bindings_dir()
    assert Path(folder).is_dir()
    assert Path(folder).resolve().is_relative_to(Path(lcp_sandbox.__file__).resolve().parent)
    manager = LollmsTOOLBindingManager(folder)
    assert "sandboxed" in manager.get_available_bindings()
    description = manager.get_binding_description("sandboxed")
    assert description["name"] == "sandboxed"
    loaded = manager._load_binding_class("sandboxed")
    assert loaded is lcp_sandbox.lollms_binding_class()
    assert issubclass(loaded, SandboxedBinding)


def test_the_bindings_folder_is_part_of_the_distribution():
    """The wheel must ship lcp_sandbox/lollms_bindings/sandboxed/ (its __init__.py is what
    LollmsClient loads, description.yaml what it describes).  Checked on the setuptools
    configuration: the folder is a listed or found package, or package data of lcp_sandbox
    (package-data patterns, or MANIFEST.in with include-package-data).  Reproduction of
    the failure: `pip wheel --no-deps -w dist . && unzip -l dist/*.whl` lists no
    lcp_sandbox/lollms_bindings/ file."""
    import fnmatch
    try:
        import tomllib
    except ImportError:                                   # Python 3.10
        tomllib = pytest.importorskip("tomli")
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    st = config.get("tool", {}).get("setuptools", {})
    wanted = ["lollms_bindings/sandboxed/__init__.py", "lollms_bindings/sandboxed/description.yaml"]
    for rel in wanted:
        assert (Path(lcp_sandbox.__file__).parent / rel).is_file(), rel
    package_data = st.get("package-data", {}) or {}
    patterns = list(package_data.get("lcp_sandbox", [])) + list(package_data.get("*", []))

    manifest = REPO / "MANIFEST.in"
    grafted = st.get("include-package-data", True) and manifest.is_file() and \
        "lollms_bindings" in manifest.read_text(encoding="utf-8")

    def as_data(rel):
        return grafted or any(fnmatch.fnmatch(rel, p) for p in patterns)

    packages = st.get("packages")
    if isinstance(packages, list):
        listed = "lcp_sandbox.lollms_bindings.sandboxed" in packages
    else:                                                # packages.find / auto-discovery
        find = (packages or {}).get("find", {}) if isinstance(packages, dict) else {}
        include = find.get("include", ["*"])
        listed = find.get("namespaces", True) and any(
            fnmatch.fnmatch("lcp_sandbox.lollms_bindings.sandboxed", p) for p in include)
    assert listed or as_data(wanted[0]), "lcp_sandbox/lollms_bindings/sandboxed/__init__.py is not shipped"
    sandboxed_data = list(package_data.get("lcp_sandbox.lollms_bindings.sandboxed", []))
    assert as_data(wanted[1]) or any(fnmatch.fnmatch("description.yaml", p) for p in sandboxed_data), \
        "lcp_sandbox/lollms_bindings/sandboxed/description.yaml is not shipped"


def test_lollms_client_creates_the_sandboxed_binding(supervisor, tmp_path):
    lollms_client = _lollms()
    asked = []
    client = lollms_client.LollmsClient(
        tools_binding_name="sandboxed", tools_bindings_dir=lcp_sandbox.lollms_bindings_dir(),
        tools_binding_config={"tools_folders": [str(LIBS), str(LOLLMS_LIBS)],
                              "host_tool_configs": {"stateful": {"start": 10}},
                              "confirm_handler": lambda *a: asked.append(a) or ("allow", ""),
                              "workspace": str(tmp_path), "supervisor": supervisor, "tenant": "dropin-client"})
    try:
        assert isinstance(client.tools, SandboxedBinding)
        b = client.tools
        assert b.host_tool_configs == {"stateful": {"start": 10}}
        assert b.confirm_handler is not None and b.workspace == str(tmp_path)
        names = {t["name"] for t in b.discover_tools()}
        assert {"tool_increment", STUDIO, "tool_client_values"} <= names
        assert b.execute_tool("tool_increment", {"step": 1})["success"] is True
        res = b.execute_tool("tool_no_host_params", {"x": 5}, lollms_client_instance=client)
        assert res == {"output": 5, "status_code": 200, "success": True}
        assert b.stats() and all(s["pid"] != os.getpid() for s in b.stats())
    finally:
        client.tools.close()


# ================================================================ lollms' orchestration, end to end
class _Painter:
    def __init__(self):
        self.prompts = []

    def generate_image(self, prompt, width=512, height=512, **kwargs):
        self.prompts.append((prompt, width, height))
        return PNG


class _Composer:
    def generate_music(self, prompt, **kwargs):
        return WAV


class _Writer:
    model_name = "writer"


_RANDOM = re.compile(r"\b(story|theme)_[0-9a-f]{8}\.(png|wav)\b")


def _scrub(value):
    if isinstance(value, str):
        return _RANDOM.sub(lambda m: f"{m.group(1)}_<id>.{m.group(2)}", value)
    return value


def _studio_client(tools_binding_name, tools_bindings_dir, config):
    """A real LollmsClient with fake modality bindings (generate_text answered by the test)."""
    lollms_client = _lollms()
    kwargs = {"tools_binding_name": tools_binding_name, "tools_binding_config": config}
    if tools_bindings_dir is not None:
        kwargs["tools_bindings_dir"] = tools_bindings_dir
    client = lollms_client.LollmsClient(**kwargs)
    client.llm, client.tti, client.ttm = _Writer(), _Painter(), _Composer()
    texts = []
    client.generate_text = lambda prompt, **kw: texts.append((prompt, kw)) or "Gulls stitch the storm. The lamp holds."
    client.recorded_texts = texts
    return client


@pytest.mark.parametrize("path", ["callable", "binding"])
def test_lollms_execute_tool_call_runs_the_studio_example_through_the_sandbox(supervisor, tmp_path,
                                                                              monkeypatch, path):
    """lollms_chat_core.execute_tool_call with a real LollmsClient and ToolContext, via the
    spec's callable (chat()) or the binding's execute_tool, against tools_binding_name='lcp'."""
    _lcp()
    from lollms_client.lollms_chat_core import execute_tool_call
    from lollms_client.lollms_types import ToolContext
    monkeypatch.chdir(tmp_path)
    results, files, texts = {}, {}, {}
    for kind in ("sandboxed", "lcp"):
        ws = tmp_path / kind
        config = {"tools_folders": [str(LOLLMS_LIBS)]}
        if kind == "sandboxed":
            config.update(supervisor=supervisor, tenant=f"dropin-e2e-{path}")
            client = _studio_client("sandboxed", lcp_sandbox.lollms_bindings_dir(), config)
        else:
            client = _studio_client("lcp", None, config)
        try:
            active = client.tools.to_chat_tool_specs() if path == "callable" else {}
            events = []
            ctx = ToolContext(client=client, callback=lambda *a: events.append(a) or True, workspace_path=ws)
            res = execute_tool_call(STUDIO, {"subject": "a lighthouse", "style": "ink"}, active, ws,
                                    lollms_client=client, discussion_instance=None, tool_context=ctx)
        finally:
            if kind == "sandboxed":
                client.tools.close()
        assert Path.cwd() == tmp_path                    # lollms restored its CWD
        results[kind] = {k: _scrub(v) for k, v in res.items()}
        files[kind] = {_scrub(p.name): p.read_bytes() for p in ws.iterdir()}
        texts[kind] = client.recorded_texts
        assert client.tti.prompts == [("ink illustration of a lighthouse, highly detailed, dramatic lighting",
                                       1024, 1024)]
    assert results["sandboxed"]["success"] is True, results["sandboxed"]
    assert results["sandboxed"] == results["lcp"]
    assert "music 'theme_<id>.wav'" in results["lcp"]["output"]
    assert files["sandboxed"] == files["lcp"] == {"story_<id>.png": PNG, "theme_<id>.wav": WAV}
    assert texts["sandboxed"] == texts["lcp"] and len(texts["lcp"]) == 1


def test_to_chat_tool_specs_as_lcp_with_dynamic_descriptions(supervisor, tmp_path, monkeypatch):
    lcp = _lcp()
    dt = _default_tools()
    folders = [str(dt / "system_shell"), str(dt / "workspace_tools"), str(dt / "user_interactive_tools")]
    monkeypatch.chdir(tmp_path)
    upstream = lcp.LCPBinding(tools_folders=folders, host_tool_configs={"system_shell": {"autonomy_level": "strict"}})
    with SandboxedBinding(tools_folders=folders, host_tool_configs={"system_shell": {"autonomy_level": "strict"}},
                          supervisor=supervisor, tenant="dropin-specs", workspace=str(tmp_path)) as b:
        ours = b.to_chat_tool_specs()
        theirs = {k: v for k, v in upstream.to_chat_tool_specs().items() if k not in PROVIDERS}
        assert set(ours) == set(theirs)
        for name, spec in theirs.items():
            for key in ("name", "description", "parameters", "output", "_source", "_python_file_path"):
                assert ours[name][key] == spec[key], (name, key)
            assert callable(ours[name]["callable"]) and ours[name]["_binding"] == "sandboxed"
        shell = ours["tool_execute_shell_command"]
        assert "STRICT MODE is active" in shell["description"]             # the dynamic prompt ran
        assert f"Working Directory (CWD): {tmp_path}" in shell["description"]
        # the discovered spec carries the dynamic description too, as upstream
        assert next(t for t in b.discovered_tools if t["name"] == "tool_execute_shell_command")["description"] \
            == shell["description"]
        # the chat() callable runs the tool in the sandbox
        (tmp_path / "hello.txt").write_text("hi there")
        assert ours["tool_read_file"]["callable"](file_name="hello.txt", discussion_instance=None,
                                                  lollms_client_instance=None, tool_context=None) == \
            {"output": "hi there", "status_code": 200, "success": True}


# ================================================================ mounting helpers vs upstream
NAMES = ["workspace_tools", "Workspace Tools", "workspace-tools", "tool_workspace_tools", "  workspace_tools  ",
         "System Shell", "system_shel", "workspace_tols", "word_tools", "excel_tools", "as_is_document_tools",
         "document_editor", "models_tools", "models", "Model Switcher", "model_switcher", "nonexistent_lib",
         "tool_execute_shell_command", "tool_read_file", "tool_list_models", "tool_dummy_cwd_test", "tool_nope",
         "tool_build_word", "tool_git_status", "dummy_test_tool", "user_interactive_tools"]
LOAD_NAMES = ["tool_configure_service_connection", "tool_git_status", "debug_toolset", "tool_list_models",
              "tool_build_word", "tool_nope", "Workspace Tools"]
GATED = ["word_tools", "excel_tools", "powerpoint_tools", "as_is_document_tools", "document_editor",
         "models_tools", "Model Switcher"]


@pytest.fixture
def upstream_binding(monkeypatch):
    """LCPBinding(...) factory.  Upstream re-parses every default tool file with ast on
    each lookup (~0.3 s a call); its pure name extractor is memoized per file so the
    comparisons stay fast (the files do not change during a test)."""
    lcp = _lcp()
    original = lcp.LCPBinding._extract_tool_names_from_file
    cache = {}

    def memoized(self, py_file):
        key = str(py_file)
        if key not in cache:
            cache[key] = frozenset(original(self, py_file))
        return set(cache[key])
    monkeypatch.setattr(lcp.LCPBinding, "_extract_tool_names_from_file", memoized)
    return lcp.LCPBinding


def _names(binding):
    return sorted(t["name"] for t in binding.discovered_tools if t["name"] not in PROVIDERS)


def _helpers_transcript(binding):
    """What a lollms host sees calling the mounting helpers in a fixed order."""
    out = []
    for n in NAMES:
        out.append(("before", n, binding.is_library_mounted(n), binding.find_library_for_tool(n),
                    binding.is_tool_available(n)))
    for n in NAMES:
        out.append(("mount", n, binding.mount_tool_library(n), binding.is_library_mounted(n), _names(binding)))
    out.append(("if_absent", binding.mount_tool_library_if_absent("dummy_test_tool"),
                binding.mount_tool_library_if_absent("git_manager"), _names(binding)))
    for n in LOAD_NAMES:
        spec = binding.load_tool_by_name(n)
        out.append(("load", n, spec and spec["name"], _names(binding)))
    for n in NAMES:
        out.append(("after", n, binding.is_library_mounted(n), binding.find_library_for_tool(n),
                    binding.is_tool_available(n)))
    return out


def _gating_transcript(binding, flags):
    out = []
    if flags is not None:
        binding.set_session_flags(flags)
    for n in GATED:
        out.append(("mount", n, binding.is_library_mounted(n), binding.mount_tool_library(n),
                    binding.mount_tool_library_if_absent(n), binding.is_library_mounted(n), _names(binding)))
    spec = binding.load_tool_by_name("tool_list_models")
    out.append(("lookups", binding.find_library_for_tool("tool_list_models"),
                binding.is_tool_available("tool_list_models"), binding.is_tool_available("tool_build_word"),
                spec and spec["name"], _names(binding)))
    return out


def test_mounting_helpers_answer_as_lcp(supervisor, empty_folder, upstream_binding):
    theirs = _helpers_transcript(upstream_binding(tools_folders=[str(empty_folder)]))
    with SandboxedBinding(tools_folders=[str(empty_folder)], supervisor=supervisor, tenant="dropin-helpers") as b:
        ours = _helpers_transcript(b)
    assert len(ours) == len(theirs)
    for mine, up in zip(ours, theirs):
        assert mine == up
    assert ("mount", "word_tools", False) == ours[NAMES.index("word_tools") + len(NAMES)][:3]
    assert "tool_git_status" in ours[-1 - len(NAMES)][-1]              # load_tool_by_name mounted git_manager


GATING = {
    "no_flags": (None, {}),
    "word_session": ({"enable_word": True}, {}),
    "office_session": ({"enable_office_files": True}, {}),
    "load_flag_kwarg": (None, {"enable_auto_model_selection": True}),
    "load_flag_host_config_str": ({"enable_excel": True},
                                  {"host_tool_configs": {"models_tools": {"enable_auto_model_selection": "yes"}}}),
    "load_flag_off_str": (None, {"host_tool_configs": {"models_tools": {"enable_auto_model_selection": "off"}}}),
}


@pytest.mark.parametrize("setup", list(GATING))
def test_office_and_load_flag_gating_as_lcp(supervisor, empty_folder, upstream_binding, setup):
    flags, kwargs = GATING[setup]
    theirs = _gating_transcript(upstream_binding(tools_folders=[str(empty_folder)], **kwargs), flags)
    with SandboxedBinding(tools_folders=[str(empty_folder)], supervisor=supervisor, tenant=f"dropin-{setup}",
                          **kwargs) as b:
        ours = _gating_transcript(b, flags)
    for mine, up in zip(ours, theirs):
        assert mine == up
    mounted = {step[1]: step[3] for step in ours[:-1]}
    models = setup in ("load_flag_kwarg", "load_flag_host_config_str")
    assert mounted["models_tools"] is models and mounted["Model Switcher"] is models
    assert mounted["word_tools"] is (setup in ("word_session",))
    assert mounted["as_is_document_tools"] is (setup in ("word_session", "office_session",
                                                         "load_flag_host_config_str"))


def test_session_flags_admit_and_withdraw_office_libraries_as_lcp(supervisor, empty_folder, upstream_binding):

    def transcript(b):
        out = [b.mount_tool_library("word_tools")]
        b.set_session_flags({"enable_word": True})
        out += [b.mount_tool_library("word_tools"), b.mount_tool_library("workspace_tools"), _names(b)]
        b.set_session_flags({})
        out += [_names(b), b.is_library_mounted("word_tools"), b.is_tool_available("tool_build_word")]
        b.set_session_flags({"enable_excel": True})
        out += [b.mount_tool_library("as_is_document_tools"), b.mount_tool_library("word_tools"),
                b.mount_tool_library("excel_tools"), _names(b)]
        b.set_session_flags(None)
        out += [_names(b), b.session_flags]
        return out

    theirs = transcript(upstream_binding(tools_folders=[str(empty_folder)]))
    with SandboxedBinding(tools_folders=[str(empty_folder)], supervisor=supervisor, tenant="dropin-flags") as b:
        ours = transcript(b)
    assert ours == theirs
    assert ours[0] is False and ours[1] is True and "tool_build_word" in ours[3] and "tool_build_word" not in ours[4]


def test_mounted_library_runs_and_is_listed(supervisor, empty_folder, tmp_path):
    _lcp()
    with SandboxedBinding(tools_folders=[str(empty_folder)], supervisor=supervisor, tenant="dropin-mounted",
                          workspace=str(tmp_path)) as b:
        assert b.execute_tool("tool_write_file", {"file_name": "a.txt", "content": "x"})["status_code"] == 404
        assert "workspace_tools" not in b.mounted_libraries
        assert b.mount_tool_library("Workspace Tools") is True
        assert "workspace_tools" in b.mounted_libraries
        assert b.execute_tool("tool_write_file", {"file_name": "a.txt", "content": "x"})["success"] is True
        assert (tmp_path / "a.txt").read_text() == "x"
        assert b.load_tool_by_name("tool_dummy_cwd_test")["name"] == "tool_dummy_cwd_test"
        assert b.execute_tool("tool_dummy_cwd_test", {"file_name": "a.txt"})["success"] is True
        assert {"workspace_tools", "dummy_test_tool"} <= set(b.mounted_libraries)


def test_host_tool_configs_is_the_live_dict(supervisor, tmp_path):
    """lollms mutates (or replaces) binding.host_tool_configs before tools load: the
    library sees what is there when its worker starts."""
    configs = {"stateful": {"start": 1}}
    with SandboxedBinding(host_tool_configs=configs, tools_folders=[str(LIBS)], supervisor=supervisor,
                          tenant="dropin-configs", workspace=str(tmp_path)) as b:
        assert b.host_tool_configs is configs
        configs["stateful"]["autonomy_level"] = "strict"
        assert b.execute_tool("tool_config", {})["output"]["plain"] == {"start": 1, "autonomy_level": "strict"}
    with SandboxedBinding(tools_folders=[str(LIBS)], supervisor=supervisor, tenant="dropin-configs-2",
                          workspace=str(tmp_path)) as b:
        assert b.host_tool_configs == {}
        b.host_tool_configs = {}
        b.host_tool_configs.setdefault("stateful", {})["flag"] = "set by host"
        assert b.execute_tool("tool_config", {})["output"]["plain"] == {"flag": "set by host"}


def test_discovered_tools_look_like_lcp(supervisor):
    lcp = _lcp()
    dt = _default_tools()
    folders = [str(dt / "workspace_tools"), str(dt / "dummy_test_tool")]
    upstream = lcp.LCPBinding(tools_folders=folders)
    with SandboxedBinding(tools_folders=folders, supervisor=supervisor, tenant="dropin-discovered") as b:
        theirs = {t["name"]: t for t in upstream.discovered_tools}
        ours = {t["name"]: t for t in b.discovered_tools}
        assert set(ours) == set(theirs)
        for name, spec in theirs.items():
            for key in ("name", "description", "input_schema", "_python_file_path"):
                assert ours[name][key] == spec[key], (name, key)


# ================================================================ without the extra
NO_LOLLMS_SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    sys.path[:0] = [LINKS, REPO]
    result = {"no_site": sys.flags.no_site,
              "lollms_findable": importlib.util.find_spec("lollms_client") is not None}
    import lcp_sandbox
    from lcp_sandbox import SandboxedBinding
    import lcp_sandbox.fronts.lollms as binding
    try:
        binding.lollms_binding_class()
        result["lollms_class"] = "made"
    except ImportError as exc:
        result["lollms_class"] = type(exc).__name__
    result["mro"] = [c.__name__ for c in SandboxedBinding.__mro__]
    result["bindings_dir"] = str(lcp_sandbox.lollms_bindings_dir())
    with SandboxedBinding(tools_folders=[LIBS], workspace=WS, timeout_s=20) as b:
        result["names"] = sorted(t["name"] for t in b.discover_tools())
        result["first"] = b.execute_tool("tool_increment", {"step": 2})
        result["second"] = b.execute_tool("tool_increment", {"step": 3})
        result["specs"] = sorted(b.list_tools()[0])
        result["mount"] = b.mount_tool_library("stateful")
        result["available"] = b.is_tool_available("tool_increment")
    result["modules"] = sorted(m for m in sys.modules if m == "lollms_client" or m.startswith("lollms_client."))
    print("RESULT " + json.dumps(result))
""")


def test_without_lollms_client_nothing_imports_it(tmp_path):
    import importlib
    import re

    import tomllib
    with open(REPO / "pyproject.toml", "rb") as f:
        runtime = [re.match(r"[A-Za-z0-9_]+", d).group(0)
                   for d in tomllib.load(f)["project"]["dependencies"]]
    links = tmp_path / "site"
    links.mkdir()
    for module in map(importlib.import_module, runtime):       # each is its own module name
        package = Path(module.__file__).resolve().parent
        (links / package.name).symlink_to(package, target_is_directory=True)
    ws = tmp_path / "ws"
    ws.mkdir()
    script = "LINKS, REPO, LIBS, WS = " + repr((str(links), str(REPO), str(LIBS), str(ws))) + NO_LOLLMS_SCRIPT
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    proc = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["no_site"] == 1 and result["lollms_findable"] is False    # genuinely absent
    assert result["lollms_class"] == "ModuleNotFoundError"
    assert "LollmsToolBinding" not in result["mro"] and result["mro"][-1] == "object"
    assert result["names"] and "tool_increment" in result["names"]
    assert result["first"] == {"output": 2, "status_code": 200, "success": True}
    assert result["second"]["output"] == 5
    assert {"name", "description", "input_schema"} <= set(result["specs"])
    assert result["mount"] is True and result["available"] is True
    assert result["modules"] == []
