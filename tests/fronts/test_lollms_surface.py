"""SandboxedBinding against the installed lollms_client's LCPBinding: its whole surface.

* every public member of ``LCPBinding`` (the installed release's, read with ``inspect``)
  exists on the lollms binding class with a signature that takes every call upstream's
  takes, so a member a later release adds fails here rather than as a user's
  ``AttributeError``;
* ``get_dynamic_tool_description`` answers as upstream's for providers of every kind, for
  its own specs and for ``LCPBinding``'s, and runs the provider in the library's worker;
* description.yaml is what ``lcp_sandbox.fronts.settings_table`` makes from the binding's
  signature and descriptions, declares every setting and command upstream's declares, and
  its ``cleanup`` command does what it says;
* ``lollms_code``'s own ``create_client`` (its exact ``tools_binding_config``, callables
  in ``host_tool_configs``) on "lcp" and on "sandboxed": the same chat specs, the same
  dynamic descriptions, and a ``system_shell`` call's confirmation reaches the app's own
  handler (its terminal prompt, answered through a stand-in ``input``).
"""
from __future__ import annotations

import inspect
import io
import itertools
import re
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES

import lcp_sandbox
from lcp_sandbox import SandboxedBinding
from lcp_sandbox.fronts import lollms_description, settings_table

lcp = pytest.importorskip("lollms_client.tools_bindings.lcp")
yaml = pytest.importorskip("yaml")
from lollms_client.lollms_tools_binding import LollmsTOOLBindingManager  # noqa: E402
from support import strict_yaml  # noqa: E402

PROMPT_LIBS = FIXTURES / "lollms_libs" / "prompt_libs"
PERSISTENT = "lollms_client.tools_bindings.lcp.persistent_"
PROVIDERS = {"tool_execute_shell_command_prompt"}
LOLLMS_FORM_TYPES = {"str", "int", "float", "bool", "list", "dict", "callable", "object"}
_tenants = itertools.count()


def _ours() -> type:
    return lcp_sandbox.lollms_binding_class()


# ================================================================ every method, compatible
def incompatibilities(theirs: inspect.Signature, ours: inspect.Signature) -> list[str]:
    """Why a call that ``theirs`` takes would fail on ``ours`` (empty: none would)."""
    P = inspect.Parameter
    positional = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)
    t_params, o_params = list(theirs.parameters.values()), list(ours.parameters.values())
    o_positional = [p for p in o_params if p.kind in positional]
    o_named = {p.name for p in o_params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    o_kinds = {p.kind for p in o_params}
    out = []
    for i, p in enumerate(p for p in t_params if p.kind in positional):
        if i >= len(o_positional):
            if P.VAR_POSITIONAL not in o_kinds:
                out.append(f"no positional parameter {i} ({p.name})")
        elif p.kind is P.POSITIONAL_OR_KEYWORD and o_positional[i].name != p.name:
            out.append(f"positional parameter {i} is {o_positional[i].name!r}, not {p.name!r}")
    for p in t_params:
        if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY) and p.name not in o_named \
                and P.VAR_KEYWORD not in o_kinds:
            out.append(f"no keyword {p.name!r}")
        if p.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD) and p.kind not in o_kinds:
            out.append(f"no {p.kind.description} parameter")
    required = {p.name for p in t_params if p.default is P.empty}
    out += [f"requires {p.name!r}, which upstream does not" for p in o_params
            if p.default is P.empty and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)
            and p.name not in required]
    return out


def test_the_signature_check_catches_what_would_break_a_caller():
    def theirs(self, a, b=1, *args, c=2, **kwargs): ...
    good = [lambda self, a, b=1, *args, c=2, d=3, **kwargs: 0]
    bad = {"no keyword 'c'": lambda self, a, b=1, *args: 0,
           "positional parameter 2 is 'x', not 'b'": lambda self, a, x=1, *args, **kw: 0,
           "no positional parameter 2 (b)": lambda self, a, **kw: 0,
           "requires 'e', which upstream does not": lambda self, a, b=1, *args, e, **kw: 0}
    sig = inspect.signature(theirs)
    for fn in good:
        assert incompatibilities(sig, inspect.signature(fn)) == []
    for problem, fn in bad.items():
        assert problem in incompatibilities(sig, inspect.signature(fn))


def _public(cls: type) -> list[str]:
    return sorted(n for n in dir(cls) if not n.startswith("_"))


def test_every_public_member_of_lcp_binding_exists_with_a_compatible_signature():
    ours = _ours()
    problems = {}
    for name in _public(lcp.LCPBinding):
        theirs_attr = inspect.getattr_static(lcp.LCPBinding, name)
        if not hasattr(ours, name):
            problems[name] = ["missing"]
            continue
        ours_attr = inspect.getattr_static(ours, name)
        if isinstance(theirs_attr, property):
            if not isinstance(ours_attr, property):
                problems[name] = ["a property upstream"]
            continue
        if isinstance(theirs_attr, (staticmethod, classmethod)) and \
                type(ours_attr) is not type(theirs_attr):
            problems[name] = [f"a {type(theirs_attr).__name__} upstream"]
            continue
        found = incompatibilities(inspect.signature(getattr(lcp.LCPBinding, name)),
                                  inspect.signature(getattr(ours, name)))
        if found:
            problems[name] = found
    assert problems == {}


def test_the_plain_binding_has_the_lcp_binding_surface_too():
    """Without lollms_client's base class: every member ``LCPBinding`` defines itself but
    ``to_chat_tool_specs`` (lollms' chat format, which its ``LollmsToolBinding`` base makes)."""
    plain = SandboxedBinding.__mro__[0]
    assert lcp.LollmsToolBinding not in plain.__mro__
    own = [n for n in vars(lcp.LCPBinding) if not n.startswith("_") and n != "to_chat_tool_specs"]
    missing = [n for n in own if not hasattr(plain, n)]
    assert missing == []
    for name in own:
        attr = inspect.getattr_static(lcp.LCPBinding, name)
        if not isinstance(attr, property):
            assert incompatibilities(inspect.signature(attr),
                                     inspect.signature(getattr(plain, name))) == [], name


# ================================================================ dynamic descriptions
@pytest.fixture
def pair(supervisor, tmp_path, monkeypatch):
    """(LCPBinding, SandboxedBinding) over tests/fixtures/lollms_libs/prompt_libs, both in tmp_path."""
    monkeypatch.chdir(tmp_path)
    theirs = lcp.LCPBinding(tools_folders=[str(PROMPT_LIBS)])
    with SandboxedBinding(tools_folders=[str(PROMPT_LIBS)], supervisor=supervisor,
                          tenant=f"surface-{next(_tenants)}") as ours:
        yield theirs, ours


def test_dynamic_descriptions_as_lcp_for_every_kind_of_provider(pair, tmp_path):
    theirs, ours = pair
    expected = {"tool_counted": f"Counts calls; 0 so far, CWD {tmp_path}.", "tool_number": "42",
                "tool_broken": None, "tool_nothing": "None", "tool_wants_args": None,
                "tool_static": None}
    their_specs = {t["name"]: t for t in theirs.discovered_tools}
    our_specs = {t["name"]: t for t in ours.discovered_tools}
    assert set(our_specs) == set(expected) | {"tool_wants_args_prompt"}
    for name, spec in our_specs.items():
        answer = ours.get_dynamic_tool_description(spec)
        assert answer == theirs.get_dynamic_tool_description(their_specs[name]), name
        assert answer == expected.get(name), name
    # LCPBinding's own specs (its prompt providers listed as tools among them) get the same
    for name, spec in their_specs.items():
        assert ours.get_dynamic_tool_description(spec) == \
            theirs.get_dynamic_tool_description(spec), name
    assert ours.get_dynamic_tool_description({"name": "tool_static"}) is None
    nope = {"name": "tool_nope", "_has_dynamic_prompt": True,
            "_dynamic_prompt_fn_name": "tool_nope_prompt"}
    assert ours.get_dynamic_tool_description(nope) is None


def test_the_dynamic_description_runs_in_the_library_worker(pair, tmp_path):
    theirs, ours = pair
    assert ours.execute_tool("tool_counted", {"step": 5})["output"] == 5
    assert theirs.execute_tool("tool_counted", {"step": 2})["output"] == 2
    spec = next(t for t in ours.discovered_tools if t["name"] == "tool_counted")
    # the host's only copy of the module is LCPBinding's (2 calls); the worker's has 5
    assert sys.modules[f"{PERSISTENT}prompt_kinds"].CALLS == 2
    assert ours.get_dynamic_tool_description(spec) == f"Counts calls; 5 so far, CWD {tmp_path}."
    assert [s["library"] for s in ours.stats()] == ["prompt_kinds"]


def test_a_spec_naming_a_file_of_no_library_of_the_binding_runs_nothing(pair, tmp_path):
    _, ours = pair
    stranger = tmp_path / "stranger.py"
    marker = tmp_path / "ran"
    stranger.write_text("def tool_number(x: int):\n    return x\n\n"
                        f"def tool_number_prompt():\n    open({str(marker)!r}, 'w').close()\n"
                        "    return 'stranger'\n")
    # the name and provider of a tool of the binding, the file of none of its libraries
    spec = {"name": "tool_number", "_has_dynamic_prompt": True, "_dynamic_prompt_fn_name":
            "tool_number_prompt", "_python_file_path": str(stranger)}
    assert ours.get_dynamic_tool_description(spec) is None
    assert not marker.exists() and ours.stats() == []
    # a known library's file, and a function its source does not define: nothing runs either
    known = next(t for t in ours.discovered_tools if t["name"] == "tool_static")
    assert ours.get_dynamic_tool_description({**known, "_has_dynamic_prompt": True,
                                              "_dynamic_prompt_fn_name": "getcwd"}) is None
    assert ours.stats() == []


def test_a_closed_binding_describes_nothing(supervisor, tmp_path):
    b = SandboxedBinding(tools_folders=[str(PROMPT_LIBS)], supervisor=supervisor,
                         tenant=f"surface-{next(_tenants)}", workspace=str(tmp_path))
    spec = next(t for t in b.discovered_tools if t["name"] == "tool_number")
    assert b.get_dynamic_tool_description(spec) == "42"
    b.close()
    assert b.get_dynamic_tool_description(spec) is None


# ================================================================ description.yaml
def _description() -> dict:
    return LollmsTOOLBindingManager(lcp_sandbox.lollms_bindings_dir()) \
        .get_binding_description("sandboxed")


def test_description_yaml_is_made_from_the_settings_source():
    """What is written is what lollms reads, every key once (PyYAML, lollms' reader, would
    keep the last of two silently), every parameter's name once."""
    written = lollms_description.PATH.read_text(encoding="utf-8")
    assert written == settings_table.render_lollms_description(), \
        f"description.yaml is stale: run `{settings_table.COMMAND}`"
    read = strict_yaml.load(written)
    assert _description() == read
    for entries in [read["global_input_parameters"],
                    *(c["parameters"] for c in read["commands"].values())]:
        names = [e["name"] for e in entries]
        assert len(names) == len(set(names)), names


def test_description_yaml_with_a_key_twice_is_refused_by_the_round_trip():
    """The reader of the test above fails on a key the writer would give twice."""
    head, params = lollms_description.HEAD, [{"name": "timeout_s", "type": "float"}]
    text = lollms_description.render(params, {}, "test")
    assert strict_yaml.load(text)["name"] == head["name"]
    twice = text.replace('  - name: "timeout_s"\n', '  - name: "timeout_s"\n    name: "x"\n')
    assert yaml.safe_load(twice)["global_input_parameters"][0]["name"] == "x"
    with pytest.raises(yaml.constructor.ConstructorError, match="found the key 'name' twice"):
        strict_yaml.load(twice)
    with pytest.raises(yaml.constructor.ConstructorError, match="found the key 'version' twice"):
        strict_yaml.load(text + 'version: "9"\n')


def test_description_declares_every_keyword_and_what_upstream_declares():
    ours = _description()
    upstream = LollmsTOOLBindingManager().get_binding_description("lcp")
    declared = {p["name"]: p for p in ours["global_input_parameters"]}
    keywords = [p for p in inspect.signature(SandboxedBinding.__dict__["__init__"]).parameters
                if p not in ("self", "kwargs")]
    assert set(keywords) <= set(declared)
    assert {p["name"] for p in upstream["global_input_parameters"]} <= set(declared)
    # every load flag a library of lollms_client's default tools declares
    flags = {m.group(1) for f in (Path(lcp.__file__).parent / "default_tools").rglob("*.py")
             for m in re.finditer(r"(?m)^TOOL_LIBRARY_LOAD_FLAG\s*=\s*[\"']([A-Za-z0-9_]+)",
                                  f.read_text(encoding="utf-8", errors="replace"))}
    assert "enable_auto_model_selection" in flags and flags <= set(declared)
    for name, param in declared.items():
        assert param["type"] in LOLLMS_FORM_TYPES and param["description"], name
        assert param["mandatory"] is False, name
    assert declared["confine"]["options"] == [True, False, "best-effort"]
    assert declared["timeout_s"]["default"] == 60.0 and declared["tenant"]["default"] == "default"
    assert "memory_mb" in declared["host_tool_configs"]["description"]
    assert set(upstream["commands"]) <= set(ours["commands"])
    for name, command in upstream["commands"].items():
        mine = ours["commands"][name]
        assert mine["function_name"] == command["function_name"]
        assert [p["name"] for p in mine["parameters"]] == [p["name"] for p in command["parameters"]]


def test_a_keyword_without_a_form_type_fails_the_generation(monkeypatch):
    monkeypatch.delitem(lollms_description.TYPES, "tenant")
    with pytest.raises(settings_table.Missing, match="'tenant' has no type"):
        settings_table.render_lollms_description()
    assert settings_table.main([]) == 1


def test_a_form_at_its_defaults_builds_a_working_binding(tmp_path, monkeypatch):
    """Every declared setting at its declared default, as a settings form would send them
    through lollms' binding manager."""
    monkeypatch.chdir(tmp_path)
    config = {p["name"]: p["default"] for p in _description()["global_input_parameters"]}
    config["tools_folder_path"] = str(PROMPT_LIBS)
    binding = LollmsTOOLBindingManager(lcp_sandbox.lollms_bindings_dir()).create_binding(
        "sandboxed", **config)
    try:
        assert isinstance(binding, SandboxedBinding) and binding.tenant == "default"
        assert binding.tools_folders == [PROMPT_LIBS]
        assert binding.execute_tool("tool_static", {})["output"] == "hi"
    finally:
        binding.close()


@pytest.mark.parametrize("flag", [True, False])
def test_the_declared_load_flag_mounts_models_tools(supervisor, flag):
    default_tools = Path(lcp.__file__).parent / "default_tools"
    with SandboxedBinding(tools_folders=[str(default_tools)], supervisor=supervisor,
                          tenant=f"surface-{next(_tenants)}",
                          enable_auto_model_selection=flag) as b:
        assert ("tool_list_models" in {t["name"] for t in b.discovered_tools}) is flag
        assert b.is_tool_available("tool_list_models") is flag


def test_the_cleanup_command_forgets_the_tools_made_from_code(supervisor, tmp_path):
    command = _description()["commands"]["cleanup"]
    defaults = {p["name"]: p["default"] for p in command["parameters"]}
    with SandboxedBinding(tools_folders=[str(PROMPT_LIBS)], supervisor=supervisor,
                          tenant=f"surface-{next(_tenants)}", workspace=str(tmp_path)) as b:
        run = getattr(b, command["function_name"])
        assert run(**defaults) == {"status": True, "removed_tools": [],
                                   "message": "no tool registered from code: nothing removed"}
        assert b.register_tool_from_code("gen", "def tool_gen_a():\n    return 'a'\n")
        assert b.register_tool_from_code(
            "shadow", "def tool_static(text: str = 'x'):\n    return {'output': 'made'}\n")
        assert b.execute_tool("tool_static", {})["output"] == "made"
        assert b.execute_tool("tool_gen_a", {})["output"] == "a"
        assert {s["library"] for s in b.stats()} == {"gen", "shadow"}
        assert run(**defaults) == {
            "status": True, "removed_tools": ["tool_gen_a", "tool_static"],
            "message": "removed 2 tool(s) registered from code (prefixes: gen, shadow)"}
        assert b.execute_tool("tool_gen_a", {})["status_code"] == 404
        assert b.execute_tool("tool_static", {})["output"] == "hi"
        assert {s["library"] for s in b.stats()} == {"prompt_kinds"}
        assert run(status="done")["message"] == "done"


# ================================================================ lollms_code's own client
@pytest.fixture
def lollms_code(monkeypatch, tmp_path):
    """build(tools_binding_name) -> LollmsClient made by lollms_code's ``create_client``.

    Only the binding's name (and, for "sandboxed", lollms' bindings folder) changes in the
    app's arguments; the LLM part is left out (no model server here: creating it would try
    to install one).  Its home is tmp_path."""
    cli = pytest.importorskip("lollms_client.apps.lollms_code.cli")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(cli, "APP_CONFIG_DIR", home / ".lollms_client" / "lollms_code")
    # lollms_client 1.21.1's own fallback imports a name its config module does not have
    monkeypatch.setattr(cli, "_resolve_modality_from_env", lambda modality: None)
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    real = cli.LollmsClient
    made = []

    def build(name):
        seen = {}

        def client(**kwargs):
            kwargs.pop("llm_binding_name", None)
            kwargs.pop("llm_binding_config", None)
            kwargs["tools_binding_name"] = name
            if name == "sandboxed":
                kwargs["tools_bindings_dir"] = lcp_sandbox.lollms_bindings_dir()
            seen.update(kwargs["tools_binding_config"])
            return real(**kwargs)
        monkeypatch.setattr(cli, "LollmsClient", client)
        config = cli.CodeAgentConfig()
        config.workspace_path = str(ws)
        made.append(cli.create_client(config))
        return made[-1], seen
    yield build, ws
    for c in made:
        if isinstance(c.tools, SandboxedBinding):
            c.tools.close()


class Terminal:
    """The app's terminal: a TTY stdin, ``input`` answered from a list, panels recorded."""

    def __init__(self, monkeypatch):
        self.answers, self.prompts, self.panels = [], [], []
        tty = io.StringIO()
        tty.isatty = lambda: True
        monkeypatch.setattr(sys, "stdin", tty)
        monkeypatch.setattr("builtins.input", self.input)
        from ascii_colors import ASCIIColors
        monkeypatch.setattr(ASCIIColors, "panel",
                            staticmethod(lambda text, *a, **k: self.panels.append(text)))

    def input(self, prompt=""):
        self.prompts.append(prompt)
        return self.answers.pop(0)


def test_lollms_code_config_on_both_bindings(lollms_code, monkeypatch):
    build, ws = lollms_code
    theirs_client, theirs_config = build("lcp")
    ours_client, ours_config = build("sandboxed")
    # lollms loads its binding's module anew for each client: its class by name
    assert type(theirs_client.tools).__name__ == "LCPBinding"
    assert isinstance(ours_client.tools, SandboxedBinding)
    handler = ours_config["host_tool_configs"]["system_shell"]["confirm_handler"]
    assert callable(handler) and ours_config["enable_auto_model_selection"] is True
    assert set(ours_config) == set(theirs_config)

    theirs = {k: v for k, v in theirs_client.tools.to_chat_tool_specs().items()
              if k not in PROVIDERS}
    ours = ours_client.tools.to_chat_tool_specs()
    assert set(ours) == set(theirs) and "tool_list_models" in ours
    for name, spec in theirs.items():
        for key in ("name", "description", "parameters", "output", "_python_file_path"):
            assert ours[name][key] == spec[key], (name, key)

    dynamic = {t["name"]: t for t in theirs_client.tools.discovered_tools
               if t.get("_has_dynamic_prompt")}
    assert "tool_execute_shell_command" in dynamic
    assert {t["name"] for t in ours_client.tools.discovered_tools
            if t.get("_has_dynamic_prompt")} == set(dynamic)
    for name, spec in dynamic.items():
        mine = next(t for t in ours_client.tools.discovered_tools if t["name"] == name)
        text = theirs_client.tools.get_dynamic_tool_description(spec)
        assert text and ours_client.tools.get_dynamic_tool_description(mine) == text
        assert f"{ws}" in text

    terminals = {}
    for label, specs in (("lcp", theirs), ("sandboxed", ours)):
        terminal = terminals[label] = Terminal(monkeypatch)
        terminal.answers = ["n", "not now", "y"]
        shell = specs["tool_execute_shell_command"]["callable"]
        terminal.results = [shell(command="echo curl"), shell(command="echo curl")]
    assert terminals["sandboxed"].results == terminals["lcp"].results
    refused, ran = terminals["sandboxed"].results
    assert refused["success"] is False and "not now" in refused["error"]
    assert ran["success"] is True and "curl" in str(ran["output"])
    for attr in ("prompts", "panels", "answers"):
        assert getattr(terminals["sandboxed"], attr) == getattr(terminals["lcp"], attr), attr
    panels = terminals["sandboxed"].panels
    assert len(panels) == 2 and "echo curl" in panels[0]
    assert terminals["sandboxed"].answers == []
