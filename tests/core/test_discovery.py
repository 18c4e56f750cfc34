"""Unit tests of lcp_sandbox.discovery: folder rules, schemas, fallback, cache, gating.

Pure: tool folders are built under tmp_path and only parsed, never imported.
"""
from __future__ import annotations

import ast
import logging
import os
import textwrap
from pathlib import Path

import pytest

from lcp_sandbox.core import discovery, schemas
from lcp_sandbox.core.discovery import FileCache, discover
from lcp_sandbox.core.schemas import parse_source, schema_from_function


# ----------------------------------------------------------------- helpers
def write(root: Path, rel: str, text: str = "") -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return p


def tool_src(name: str, doc: str = "", params: str = "") -> str:
    body = f'    """{doc}"""\n' if doc else ""
    return f"def {name}({params}):\n{body}    return {{'success': True}}\n\n\n"


def run(*folders: Path, **kwargs) -> discovery.Discovered:
    kwargs.setdefault("cache", FileCache())
    return discover(list(folders), **kwargs)


def names(found: discovery.Discovered) -> list[str]:
    return [s["name"] for s in found.specs]


def by_name(found: discovery.Discovered) -> dict:
    return {s["name"]: s for s in found.specs}


def tooldef(src: str, name: str | None = None) -> schemas.ToolDef:
    tree = ast.parse(textwrap.dedent(src))
    fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    node = fns[0] if name is None else next(n for n in fns if n.name == name)
    return schema_from_function(node)


def schema(src: str, name: str | None = None) -> dict:
    return tooldef(src, name).spec["input_schema"]


# ------------------------------------------------------------ folder rules
def test_subdir_primary_first_then_sorted_siblings(tmp_path):
    write(tmp_path, "lib/zeta.py", tool_src("tool_z"))
    write(tmp_path, "lib/alpha.py", tool_src("tool_a"))
    write(tmp_path, "lib/lib.py", tool_src("tool_primary"))
    write(tmp_path, "lib/__init__.py", tool_src("tool_init"))
    write(tmp_path, "lib/notes.txt", "def tool_txt(): pass\n")
    write(tmp_path, "lib/sub/sub.py", tool_src("tool_too_deep"))
    (libs,) = list(discovery.iter_libraries([tmp_path]))
    assert libs.name == "lib"
    assert libs.key == str((tmp_path / "lib").resolve())
    assert libs.root == (tmp_path / "lib").resolve()
    assert [p.name for p in libs.files] == ["lib.py", "alpha.py", "zeta.py"]
    found = run(tmp_path)
    assert names(found) == ["tool_primary", "tool_a", "tool_z"]
    assert [found.routes[n].index for n in names(found)] == [0, 1, 2]
    assert by_name(found)["tool_a"]["_python_file_path"] == str((tmp_path / "lib/alpha.py").resolve())
    assert all(s["_library"] == "lib" for s in found.specs)
    assert list(found.libraries) == [libs.key]


def test_subdir_without_primary_uses_all_its_py_files_sorted(tmp_path):
    write(tmp_path, "pack/b.py", tool_src("tool_b"))
    write(tmp_path, "pack/a.py", tool_src("tool_a"))
    write(tmp_path, "pack/__init__.py", tool_src("tool_init"))
    (lib,) = list(discovery.iter_libraries([tmp_path]))
    assert lib.name == "pack"
    assert [p.name for p in lib.files] == ["a.py", "b.py"]
    assert names(run(tmp_path)) == ["tool_a", "tool_b"]


def test_loose_files_init_skipped_and_non_python_ignored(tmp_path):
    write(tmp_path, "one.py", tool_src("tool_one"))
    write(tmp_path, "__init__.py", tool_src("tool_init"))
    write(tmp_path, "readme.md", "def tool_md(): pass\n")
    write(tmp_path, "script.pyc", "")
    (tmp_path / "empty_dir").mkdir()
    write(tmp_path, "docs/readme.txt", "nothing")
    libs = list(discovery.iter_libraries([tmp_path]))
    assert [(lib.name, [p.name for p in lib.files]) for lib in libs] == [("one", ["one.py"])]
    assert libs[0].root == tmp_path.resolve()
    assert names(run(tmp_path)) == ["tool_one"]


def test_tool_files_come_after_folders(tmp_path):
    folder = tmp_path / "folder"
    write(folder, "a.py", tool_src("tool_shared", "From folder."))
    extra = write(tmp_path, "extra/extra_tool.py",
                  tool_src("tool_shared", "From tool_files.") + tool_src("tool_extra"))
    not_py = write(tmp_path, "extra/notes.txt", tool_src("tool_txt"))
    found = run(folder, tool_files=[extra, not_py, tmp_path / "missing.py", str(extra)])
    assert names(found) == ["tool_shared", "tool_extra"]
    assert by_name(found)["tool_shared"]["description"] == "From folder."
    assert found.routes["tool_extra"].library.name == "extra_tool"
    assert found.routes["tool_extra"].library.files == (extra,)


def test_tool_files_alone(tmp_path):
    f = write(tmp_path, "solo.py", tool_src("tool_solo"))
    found = discover([], [f], cache=FileCache())
    assert names(found) == ["tool_solo"]
    assert found.routes["tool_solo"].library.key == str(f.resolve())


def test_folders_in_given_order_missing_folder_skipped(tmp_path):
    first, second = tmp_path / "zz_first", tmp_path / "aa_second"
    write(first, "x.py", tool_src("tool_same", "First folder."))
    write(second, "x.py", tool_src("tool_same", "Second folder.") + tool_src("tool_only_second"))
    found = run(tmp_path / "nope", first, second)
    assert names(found) == ["tool_same", "tool_only_second"]
    assert by_name(found)["tool_same"]["description"] == "First folder."
    # A file passed as a folder is ignored too.
    assert names(run(first / "x.py")) == []


def test_sorted_order_independent_of_creation_order(tmp_path):
    for stem in ("m", "c", "x", "a"):
        write(tmp_path, f"{stem}.py", tool_src(f"tool_{stem}"))
    write(tmp_path, "b/b.py", tool_src("tool_b"))
    assert names(run(tmp_path)) == ["tool_a", "tool_b", "tool_c", "tool_m", "tool_x"]


def test_dedup_first_wins_and_warns_naming_both_files(tmp_path, caplog):
    a = write(tmp_path, "a_lib.py", tool_src("tool_dup", "From a.", "x: int"))
    b = write(tmp_path, "b_lib.py", tool_src("tool_dup", "From b.", "y: str") + tool_src("tool_b"))
    with caplog.at_level(logging.WARNING, logger="lcp_sandbox.discovery"):
        found = run(tmp_path)
    assert names(found) == ["tool_dup", "tool_b"]
    spec = by_name(found)["tool_dup"]
    assert spec["description"] == "From a."
    assert list(spec["input_schema"]["properties"]) == ["x"]
    assert found.routes["tool_dup"].library.name == "a_lib"
    warnings = [r for r in caplog.records
                if r.levelno == logging.WARNING and "tool_dup" in r.getMessage()]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert str(a) in msg or str(a.resolve()) in msg
    assert str(b) in msg or str(b.resolve()) in msg


def test_dedup_inside_one_file_first_definition_wins(tmp_path, caplog):
    write(tmp_path, "lib.py", tool_src("tool_x", "First.", "a: int") + tool_src("tool_x", "Second.", "b: str"))
    with caplog.at_level(logging.WARNING, logger="lcp_sandbox.discovery"):
        found = run(tmp_path)
    assert [s["description"] for s in found.specs] == ["First."]
    assert any("tool_x" in r.getMessage() for r in caplog.records)


def test_dedup_primary_beats_sibling_that_sorts_first(tmp_path):
    write(tmp_path, "lib/aaa.py", tool_src("tool_dup", "Sibling."))
    write(tmp_path, "lib/lib.py", tool_src("tool_dup", "Primary."))
    found = run(tmp_path)
    assert by_name(found)["tool_dup"]["description"] == "Primary."
    assert found.routes["tool_dup"].index == 0


def test_dynamic_libraries_win_over_files(tmp_path):
    write(tmp_path, "lib.py", tool_src("tool_x", "From file.") + tool_src("tool_y"))
    dyn = discovery.dynamic_library("art", tool_src("tool_x", "From code.", "n: int"))
    found = run(tmp_path, dynamic=[dyn])
    assert names(found) == ["tool_x", "tool_y"]
    assert by_name(found)["tool_x"]["description"] == "From code."
    assert by_name(found)["tool_x"]["_python_file_path"] is None
    assert found.routes["tool_x"].library.dynamic
    assert found.routes["tool_x"].library.key == "dynamic:art"


# -------------------------------------------------------------- description
@pytest.mark.parametrize("doc_src, expected", [
    ('"""One line."""', "One line."),
    ('"""\n    First line\n    second line.\n\n    Second paragraph.\n    """', "First line\nsecond line."),
    ('"""\n\n    Leading blank lines.\n\n    More.\n    """', "Leading blank lines."),
    ("'''Single quotes count too.'''", "Single quotes count too."),
    ('""""""', "No description provided."),
    ("x = 1", "No description provided."),
])
def test_description_is_first_docstring_paragraph(doc_src, expected):
    src = f"def tool_d():\n    {doc_src}\n    return 1\n"
    assert tooldef(src).spec["description"] == expected


def test_no_docstring_gives_default_description():
    assert tooldef("def tool_d(a: int):\n    return a\n").spec["description"] == "No description provided."


# --------------------------------------------------- parameter descriptions
def test_parameter_descriptions_from_docstring_styles():
    src = '''
    def tool_p(alpha, beta, gamma, delta, eps, zeta, eta):
        """Does things.

        Args:
            alpha (str): Google style.
            beta: colon style
            gamma - dash style
            - delta: bulleted
            * eps (int): starred typed
            1. zeta: numbered
        """
    '''
    props = schema(src)["properties"]
    assert {k: v["description"] for k, v in props.items()} == {
        "alpha": "Google style.", "beta": "colon style", "gamma": "dash style",
        "delta": "bulleted", "eps": "starred typed", "zeta": "numbered",
        "eta": "Parameter 'eta'",
    }


def test_docstring_type_does_not_override_annotation_and_last_line_wins():
    src = '''
    def tool_p(n: int, s):
        """Doc.

        n (str): first
        n (str): second
        s (int): an int in the docstring only
        """
    '''
    props = schema(src)["properties"]
    assert props["n"] == {"type": "integer", "description": "second"}
    assert props["s"] == {"type": "string", "description": "an int in the docstring only"}


# ------------------------------------------------------------ type mapping
@pytest.mark.parametrize("annotation, expected", [
    ("int", "integer"), ("float", "number"), ("number", "number"), ("Number", "number"),
    ("bool", "boolean"), ("list", "array"), ("List[str]", "array"), ("array", "array"),
    ("np.ndarray", "array"), ("dict", "object"), ("Dict[str, str]", "object"),
    ("object", "object"), ("str", "string"), ("Any", "string"), ("Path", "string"),
    ("bytes", "string"), ("'int'", "integer"), ("INT", "integer"), ("Optional[bool]", "boolean"),
    # substring rule, first row wins:
    ("List[int]", "integer"), ("Optional[float]", "number"), ("Point", "integer"),
    ("Dict[str, bool]", "boolean"), ("Dict[str, list]", "array"), ("Tuple[float, int]", "integer"),
])
def test_annotation_type_table(annotation, expected):
    assert schemas.json_type(annotation) == expected
    props = schema(f"def tool_t(p: {annotation}):\n    pass\n")["properties"]
    assert props["p"]["type"] == expected


def test_missing_annotation_is_string():
    assert schema("def tool_t(p, q=3):\n    pass\n")["properties"]["q"]["type"] == "string"
    assert schema("def tool_t(p):\n    pass\n")["properties"]["p"]["type"] == "string"


# ---------------------------------------------------------------- defaults
@pytest.mark.parametrize("default_src, expected, literal", [
    ("3", 3, True), ("-2.5", -2.5, True), ("'hi'", "hi", True), ('""', "", True),
    ("True", True, True), ("None", None, True), ("[1, 'a']", [1, "a"], True),
    ("{'k': (1, 2)}", {"k": (1, 2)}, True), ("(1,)", (1,), True), ("{1, 2}", {1, 2}, True),
    ("0x10", 16, True), ("1e3", 1000.0, True), ("b'x'", b"x", True),
    ("os.sep", "os.sep", False), ("len", "len", False), ("2 * 3", "2 * 3", False),
    ("list()", "list()", False), ("Path('.')", "Path('.')", False),
    ("'a' + 'b'", "a' + 'b", False),   # source text, outer quotes stripped
    ("[x for x in ()]", "[x for x in ()]", False),
])
def test_defaults_literal_eval_with_source_fallback(default_src, expected, literal):
    td = tooldef(f"def tool_d(req, p={default_src}):\n    pass\n")
    prop = td.spec["input_schema"]["properties"]["p"]
    assert prop["default"] == expected
    assert type(prop["default"]) is type(expected)
    assert td.spec["input_schema"]["required"] == ["req"]
    if literal:
        assert td.literal_defaults == {"p": expected}
    else:
        assert td.literal_defaults == {}


def test_only_literal_defaults_land_in_route_defaults(tmp_path):
    write(tmp_path, "lib.py", """
        import os
        def tool_d(a: int, b: int = 5, c=os.sep, *, d: str = "kw", e=len, f=None):
            pass
    """)
    found = run(tmp_path)
    assert found.routes["tool_d"].defaults == {"b": 5, "d": "kw", "f": None}
    props = by_name(found)["tool_d"]["input_schema"]["properties"]
    assert props["c"]["default"] == "os.sep"
    assert props["e"]["default"] == "len"


def test_required_are_parameters_without_default_in_order():
    s = schema("def tool_r(a, b: int, c=1, *, d, e=2, f):\n    pass\n")
    assert s["required"] == ["a", "b", "d", "f"]
    assert list(s["properties"]) == ["a", "b", "c", "d", "e", "f"]
    assert s["type"] == "object"


def test_positional_only_parameters_keep_their_own_defaults():
    # BUG: schema_from_function pads/zips func.args.defaults against func.args
    # only, but the defaults list also covers func.args.posonlyargs, so every
    # regular parameter after a defaulted positional-only one takes its
    # neighbour's default (b gets 1 instead of 2, c gets 2 instead of "three").
    # Upstream LCPBinding aligns these correctly.
    td = tooldef("def tool_p(a: int = 1, /, b: int = 2, c: str = 'three'):\n    pass\n")
    props = td.spec["input_schema"]["properties"]
    assert props["b"]["default"] == 2
    assert props["c"]["default"] == "three"
    assert td.literal_defaults == {"b": 2, "c": "three"}


def test_positional_only_without_defaults_are_not_shown():
    s = schema("def tool_p(a: int, /, b: int, c: int = 7):\n    pass\n")
    assert s["properties"] == {"b": {"type": "integer", "description": "Parameter 'b'"},
                               "c": {"type": "integer", "description": "Parameter 'c'", "default": 7}}
    assert s["required"] == ["b"]


# ---------------------------------------------------------- hidden params
def test_hidden_parameters_never_appear():
    src = '''
    def tool_h(query: str, tool_context=None, lollms_client_instance=None, discussion_instance=None,
               user_interaction_handler=None, *args, extra: int = 1, **kwargs):
        """Doc.

        Args:
            query (str): q
            tool_context (dict): hidden
        """
    '''
    td = tooldef(src)
    s = td.spec["input_schema"]
    assert list(s["properties"]) == ["query", "extra"]
    assert s["required"] == ["query"]
    assert td.llm_param_count == 2
    assert schemas.HIDDEN_PARAMS == {"args", "kwargs", "discussion_instance", "lollms_client_instance",
                                       "tool_context", "user_interaction_handler"}


def test_hidden_names_hidden_as_plain_and_keyword_only_params():
    s = schema("def tool_h(args, kwargs, v, *, tool_context, discussion_instance=None):\n    pass\n")
    assert list(s["properties"]) == ["v"]
    assert s["required"] == ["v"]


def test_keyword_only_parameters_included():
    s = schema('''
    def tool_k(path: str, *, recursive: bool = False, depth: int, tags: list = ["a"]):
        """Doc.

        depth (int): max depth
        """
    ''')
    assert s["properties"] == {
        "path": {"type": "string", "description": "Parameter 'path'"},
        "recursive": {"type": "boolean", "description": "Parameter 'recursive'", "default": False},
        "depth": {"type": "integer", "description": "max depth"},
        "tags": {"type": "array", "description": "Parameter 'tags'", "default": ["a"]},
    }
    assert s["required"] == ["path", "depth"]


# ------------------------------------------------------------------ nesting
def test_nested_tool_functions_are_included_in_source_order(tmp_path):
    write(tmp_path, "lib.py", '''
        import sys

        def tool_outer(x: int):
            """Outer."""
            def tool_inner(y: str):
                """Inner."""
            return tool_inner

        class Box:
            def tool_method(self, z: float = 1.0):
                """Method."""

        if sys:
            def tool_cond():
                """Conditional."""

        def helper():
            def tool_in_helper():
                """In helper."""

        async def tool_async(x):
            """Async functions are not tools."""
            def tool_in_async():
                """Inside an async def."""

        def not_a_tool():
            pass
    ''')
    found = run(tmp_path)
    assert names(found) == ["tool_outer", "tool_inner", "tool_method", "tool_cond",
                            "tool_in_helper", "tool_in_async"]
    assert by_name(found)["tool_method"]["input_schema"]["required"] == ["self"]
    parsed = FileCache().parse(tmp_path / "lib.py")
    assert {"helper", "not_a_tool", "tool_async", "tool_inner"} <= parsed.function_names


# --------------------------------------------------------- prompt providers
def test_tool_level_prompt_provider_is_not_a_tool(tmp_path):
    write(tmp_path, "weather.py",
          tool_src("tool_forecast", "Forecast.", "city: str")
          + tool_src("tool_forecast_prompt", "Provider.", "tool_context=None, **kwargs"))
    found = run(tmp_path)
    assert names(found) == ["tool_forecast"]
    spec = by_name(found)["tool_forecast"]
    assert spec["_has_dynamic_prompt"] is True
    assert spec["_dynamic_prompt_fn_name"] == "tool_forecast_prompt"
    assert spec["_dynamic_prompt_file_index"] == 0
    assert found.prompt_providers == {}


def test_tool_level_prompt_provider_before_its_tool_and_in_sibling_file(tmp_path):
    write(tmp_path, "lib/lib.py", tool_src("tool_area", "Area."))
    write(tmp_path, "lib/a_first.py", tool_src("tool_area_prompt", "Provider.") + tool_src("tool_b"))
    found = run(tmp_path)
    assert names(found) == ["tool_area", "tool_b"]
    spec = by_name(found)["tool_area"]
    assert spec["_has_dynamic_prompt"] is True
    assert spec["_dynamic_prompt_fn_name"] == "tool_area_prompt"
    assert spec["_dynamic_prompt_file_index"] == 1
    assert "_has_dynamic_prompt" not in by_name(found)["tool_b"]


def test_tool_in_other_library_does_not_make_a_provider(tmp_path):
    write(tmp_path, "a.py", tool_src("tool_forecast"))
    write(tmp_path, "b.py", tool_src("tool_forecast_prompt"))
    found = run(tmp_path)
    assert names(found) == ["tool_forecast", "tool_forecast_prompt"]
    assert "_has_dynamic_prompt" not in by_name(found)["tool_forecast"]


@pytest.mark.parametrize("layout", ["loose", "folder"])
def test_library_prompt_provider(tmp_path, layout):
    if layout == "loose":
        write(tmp_path, "geo.py", tool_src("tool_geo_prompt", "Library context.") + tool_src("tool_dist"))
        index = 0
    else:
        write(tmp_path, "geo/geo.py", tool_src("tool_dist"))
        write(tmp_path, "geo/other.py", tool_src("tool_geo_prompt", "Library context."))
        index = 1
    found = run(tmp_path)
    assert names(found) == ["tool_dist"]
    lib, fn, idx = found.prompt_providers["geo"]
    assert (lib.name, fn, idx) == ("geo", "tool_geo_prompt", index)
    assert "_has_dynamic_prompt" not in by_name(found)["tool_dist"]


def test_library_with_only_a_provider_is_registered(tmp_path):
    write(tmp_path, "ctx.py", tool_src("tool_ctx_prompt"))
    found = run(tmp_path)
    assert found.specs == []
    assert list(found.prompt_providers) == ["ctx"]
    assert list(found.libraries) == [str((tmp_path / "ctx.py").resolve())]


def test_library_without_tools_is_not_registered(tmp_path):
    write(tmp_path, "helpers.py", "def helper():\n    pass\n")
    found = run(tmp_path)
    assert found.specs == [] and found.libraries == {} and found.routes == {}


def test_other_prompt_functions_stay_tools(tmp_path):
    write(tmp_path, "lib.py",
          tool_src("tool_summary_prompt", "No tool_summary exists.")
          + tool_src("tool_search", "Search.", "q: str")
          + tool_src("tool_search_prompt", "Has a parameter.", "q: str")
          + tool_src("tool_prompt", "Just a name."))
    found = run(tmp_path)
    assert names(found) == ["tool_summary_prompt", "tool_search", "tool_search_prompt", "tool_prompt"]
    assert found.prompt_providers == {}
    assert by_name(found)["tool_search_prompt"]["input_schema"]["required"] == ["q"]


# ----------------------------------------------------------- regex fallback
BROKEN = '''
"""Broken file."""
TOOL_LIBRARY_NAME = "Broken"


def tool_search(query: str, limit: int = 5, ratio: float=0.5, items: List[str] = [], plain, opt=3):
    """Searches despite the error.

    Second paragraph.
    """
    return 1


def tool_star(name: str, *args, tool_context=None, **kwargs):
    return 2


def tool_after():
    """After."""

def oops(:
'''


def test_regex_fallback_extracts_tools_and_marks_them(tmp_path):
    write(tmp_path, "broken.py", BROKEN)
    found = run(tmp_path)
    specs = by_name(found)
    assert list(specs) == ["tool_search", "tool_star", "tool_after"]
    assert all(s["_parsed_via_regex_fallback"] is True for s in specs.values())
    s = specs["tool_search"]
    assert s["description"] == "Searches despite the error."
    assert s["input_schema"] == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Parameter 'query'"},
            "limit": {"type": "integer", "description": "Parameter 'limit'", "default": "5"},
            "ratio": {"type": "number", "description": "Parameter 'ratio'", "default": "0.5"},
            "items": {"type": "array", "description": "Parameter 'items'", "default": "[]"},
            "plain": {"type": "string", "description": "Parameter 'plain'"},
            "opt": {"type": "string", "description": "Parameter 'opt'"},
        },
        "required": ["query", "plain"],
    }
    # Star and hidden parameters are skipped; a missing docstring borrows the
    # next one within reach (lossy, like upstream).
    assert specs["tool_star"]["input_schema"]["properties"] == {
        "name": {"type": "string", "description": "Parameter 'name'"}}
    assert specs["tool_star"]["description"] == "After."
    assert found.routes["tool_search"].defaults == {}
    parsed = FileCache().parse(tmp_path / "broken.py")
    assert parsed.via_regex is True
    assert parsed.function_names == {"tool_search", "tool_star", "tool_after"}
    assert parsed.display_name == "Broken"


def test_regex_fallback_description_without_any_docstring():
    (td,) = schemas.regex_tools("def tool_x(a: int):\n  return (\n")
    assert td.spec["description"] == "Executes tool_x."
    assert td.llm_param_count == 1


def test_regex_fallback_skips_positional_only_marker():
    # BUG (minor): the fallback skips `*`-markers but keeps the positional-only
    # marker `/` as a required string parameter named "/", which is never a
    # valid parameter name.
    (td,) = schemas.regex_tools("def tool_x(a: int, /, b: str):\n  return (\n")
    assert list(td.spec["input_schema"]["properties"]) == ["a", "b"]
    assert td.spec["input_schema"]["required"] == ["a", "b"]


def test_regex_prompt_provider_rules_apply(tmp_path):
    write(tmp_path, "bro.py", "def tool_x(a: int):\n    pass\n\ndef tool_x_prompt():\n    pass\n"
          "def tool_bro_prompt():\n    pass\ndef (:\n")
    found = run(tmp_path)
    assert names(found) == ["tool_x"]
    assert by_name(found)["tool_x"]["_has_dynamic_prompt"] is True
    assert list(found.prompt_providers) == ["bro"]


@pytest.mark.parametrize("text", [
    "", "def tool_(", "def tool_x(", "\x00\x01 def tool_y(a:int):", "def tool_z(: : ,,=,)\n:",
    "def tool_q(a=, b:, =c):\n" * 3, '"""' * 7, "def tool_w(a: int) -> :\n",
])
def test_regex_fallback_never_raises_on_garbage(text):
    tools = schemas.regex_tools(text)
    assert isinstance(tools, list)
    parsed = parse_source(text)
    assert isinstance(parsed.tools, list)


def test_regex_fallback_swallows_internal_errors(monkeypatch, caplog):
    class Exploding:
        def finditer(self, text):
            raise RuntimeError("boom")
    monkeypatch.setattr(schemas, "_REGEX_DEF_RE", Exploding())
    with caplog.at_level(logging.WARNING, logger="lcp_sandbox.discovery"):
        assert schemas.regex_tools("def tool_x(a): pass") == []
    assert any("boom" in r.getMessage() for r in caplog.records)


def test_parse_source_uses_ast_when_valid():
    parsed = parse_source("def tool_ok(a: int):\n    '''Fine.'''\n")
    assert parsed.via_regex is False
    assert "_parsed_via_regex_fallback" not in parsed.tools[0].spec


def test_undecodable_bytes_do_not_break_discovery(tmp_path):
    p = tmp_path / "latin.py"
    p.write_bytes(b"# caf\xe9\ndef tool_latin(a: int):\n    '''Latin-1 comment above.'''\n")
    assert names(run(tmp_path)) == ["tool_latin"]


# ---------------------------------------------------------------- FileCache
@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = schemas.parse_source

    def wrapper(text, **kw):
        calls.append(text)
        return real(text, **kw)
    monkeypatch.setattr(discovery, "parse_source", wrapper)
    return calls


def test_file_cache_does_not_reparse_unchanged_files(tmp_path, counted):
    write(tmp_path, "a.py", tool_src("tool_a"))
    write(tmp_path, "b/b.py", tool_src("tool_b"))
    write(tmp_path, "b/c.py", tool_src("tool_c"))
    cache = FileCache()
    first = run(tmp_path, cache=cache)
    assert len(counted) == 3
    second = run(tmp_path, cache=cache)
    assert len(counted) == 3
    assert names(first) == names(second) == ["tool_a", "tool_b", "tool_c"]
    assert cache.parse(tmp_path / "a.py") is cache.parse(tmp_path / "a.py")
    assert len(counted) == 3


def test_file_cache_reparses_after_a_change(tmp_path, counted):
    p = write(tmp_path, "a.py", tool_src("tool_a", "Old."))
    cache = FileCache()
    assert by_name(run(tmp_path, cache=cache))["tool_a"]["description"] == "Old."
    p.write_text(tool_src("tool_a", "New, longer description."), encoding="utf-8")
    assert by_name(run(tmp_path, cache=cache))["tool_a"]["description"] == "New, longer description."
    assert len(counted) == 2


def test_file_cache_reparses_same_size_change_with_new_mtime(tmp_path, counted):
    p = write(tmp_path, "a.py", tool_src("tool_a", "AAA."))
    st = os.stat(p)
    cache = FileCache()
    cache.parse(p)
    p.write_text(tool_src("tool_a", "BBB."), encoding="utf-8")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert os.stat(p).st_size == st.st_size
    assert cache.parse(p).tools[0].spec["description"] == "BBB."
    assert len(counted) == 2


def test_file_cache_missing_file(tmp_path, counted):
    assert FileCache().parse(tmp_path / "nope.py") is None
    assert counted == []


def test_returned_specs_are_copies_of_the_cache(tmp_path):
    write(tmp_path, "a.py", tool_src("tool_a", "Doc.", "x: int"))
    cache = FileCache()
    first = run(tmp_path, cache=cache)
    first.specs[0]["description"] = "mutated"
    first.specs[0]["input_schema"]["properties"]["x"]["type"] = "mutated"
    second = run(tmp_path, cache=cache)
    assert second.specs[0]["description"] == "Doc."
    assert second.specs[0]["input_schema"]["properties"]["x"]["type"] == "integer"


# ------------------------------------------------------------------ gating
@pytest.mark.parametrize("stem, flags, admitted", [
    ("workspace_tools", None, True),
    ("word_tools", None, False),
    ("word_tools", {"enable_word": True}, True),
    ("word_tools", {"enable_office_files": True}, False),    # per-software: own flag only
    ("word_tools", {"enable_excel": True}, False),
    ("excel_tools", {"enable_excel": 1}, True),
    ("powerpoint_tools", {"enable_powerpoint": "yes"}, True),
    ("powerpoint_tools", {"enable_powerpoint": ""}, False),
    ("docx_mastery", None, False),
    ("docx_mastery", {}, False),
    ("docx_mastery", "not-a-dict", False),
    ("docx_mastery", {"enable_office_files": True}, True),
    ("pptx_builder", {"enable_word": True}, True),           # legacy: any office flag
    ("as_is_document_tools", {"enable_office_files": False, "enable_excel": False}, False),
    ("xlsx_mastery", {"enable_powerpoint": True}, True),
])
def test_office_library_admitted(stem, flags, admitted):
    assert discovery.office_library_admitted(stem, flags) is admitted


def test_office_gate_applies_in_discover(tmp_path):
    write(tmp_path, "word_tools.py", tool_src("tool_word"))
    write(tmp_path, "docx_mastery/docx_mastery.py", tool_src("tool_docx"))
    write(tmp_path, "plain.py", tool_src("tool_plain"))
    assert names(run(tmp_path)) == ["tool_plain"]
    assert names(run(tmp_path, session_flags={"enable_word": True})) == ["tool_docx", "tool_plain", "tool_word"]
    assert names(run(tmp_path, session_flags={"enable_office_files": True})) == ["tool_docx", "tool_plain"]


def test_office_gate_is_per_file_stem_in_a_folder(tmp_path):
    write(tmp_path, "suite/suite.py", tool_src("tool_suite"))
    write(tmp_path, "suite/excel_tools.py", tool_src("tool_excel"))
    assert names(run(tmp_path)) == ["tool_suite"]
    assert names(run(tmp_path, session_flags={"enable_excel": True})) == ["tool_suite", "tool_excel"]


FLAGGED = 'TOOL_LIBRARY_LOAD_FLAG = "enable_gated"\n'


@pytest.mark.parametrize("host_cfg, load_flags, permitted", [
    ({}, {}, False),
    ({"gated": {"enable_gated": True}}, {}, True),
    ({"gated": {"enable_gated": False}}, {"enable_gated": True}, False),   # host config wins
    ({}, {"enable_gated": True}, True),
    ({"other": {"enable_gated": True}}, {}, False),                         # keyed by stem
    ({"gated": None}, {"enable_gated": 1}, True),
    ({"gated": {"enable_gated": "true"}}, {}, True),
    ({"gated": {"enable_gated": " YES "}}, {}, True),
    ({"gated": {"enable_gated": "1"}}, {}, True),
    ({"gated": {"enable_gated": "On"}}, {}, True),
    ({"gated": {"enable_gated": "false"}}, {}, False),
    ({"gated": {"enable_gated": "0"}}, {}, False),
    ({"gated": {"enable_gated": "enabled"}}, {}, False),
    ({"gated": {"enable_gated": ""}}, {}, False),
])
def test_file_permitted(host_cfg, load_flags, permitted):
    parsed = parse_source(FLAGGED + tool_src("tool_g"))
    assert parsed.load_flag == "enable_gated"
    assert discovery.file_permitted(parsed, "gated", host_cfg, load_flags) is permitted


def test_file_without_flag_is_always_permitted():
    parsed = parse_source(tool_src("tool_g") + "x = 'TOOL_LIBRARY_LOAD_FLAG = \"no\"'\n")
    assert parsed.load_flag is None
    assert discovery.file_permitted(parsed, "gated", {}, {}) is True


def test_load_flag_gate_applies_in_discover_per_file(tmp_path):
    write(tmp_path, "gated.py", FLAGGED + tool_src("tool_g"))
    write(tmp_path, "pack/pack.py", tool_src("tool_pack"))
    write(tmp_path, "pack/secret.py", 'TOOL_LIBRARY_LOAD_FLAG = "enable_secret"\n' + tool_src("tool_secret"))
    assert names(run(tmp_path)) == ["tool_pack"]
    assert names(run(tmp_path, host_tool_configs={"gated": {"enable_gated": "yes"}})) == ["tool_g", "tool_pack"]
    assert names(run(tmp_path, load_flags={"enable_secret": True})) == ["tool_pack", "tool_secret"]
    assert names(run(tmp_path, host_tool_configs={"secret": {"enable_secret": True}},
                     load_flags={"enable_gated": "on"})) == ["tool_g", "tool_pack", "tool_secret"]


# -------------------------------------------------- docstring-declared params
KWARGS_DOC = '''
def tool_kw(**kwargs):
    """Takes anything.

    Args:
        query (str): The query.
        limit (int, optional): How many.
        ratio (float): A ratio.
        enabled (bool): A flag.
        items (list): Lists are strings here.
        score (number): Not in the docstring table.
        fallback (str, default 'x'): Has a default.
        plain: No type.
        tool_context (dict): Hidden.
        kwargs (dict): Hidden too.
    Parameters:
        mode - a mode
    Returns:
        dict: the result
    Example: tool_kw(query="a")
    """
'''


def test_docstring_declared_parameters_for_kwargs_only():
    td = tooldef(KWARGS_DOC)
    s = td.spec["input_schema"]
    assert s["properties"] == {
        "query": {"type": "string", "description": "The query."},
        "limit": {"type": "integer", "description": "How many."},
        "ratio": {"type": "number", "description": "A ratio."},
        "enabled": {"type": "boolean", "description": "A flag."},
        "items": {"type": "string", "description": "Lists are strings here."},
        "score": {"type": "string", "description": "Not in the docstring table."},
        "fallback": {"type": "string", "description": "Has a default."},
        "plain": {"type": "string", "description": "No type."},
        "mode": {"type": "string", "description": "a mode"},
        "dict": {"type": "string", "description": "the result"},   # lossy, as upstream
    }
    assert s["required"] == ["query", "ratio", "enabled", "items", "score", "plain", "mode", "dict"]
    assert td.llm_param_count == 0
    assert td.literal_defaults == {}


def test_docstring_declared_parameters_for_hidden_only_function():
    s = schema('''
    def tool_h(tool_context=None, lollms_client_instance=None):
        """Doc.

        tool_context (dict): hidden
        lollms_client_instance: hidden
        user_interaction_handler: hidden
        topic (str): visible
        """
    ''')
    assert list(s["properties"]) == ["topic"]
    assert s["required"] == ["topic"]


def test_docstring_parameters_ignored_when_a_visible_parameter_exists():
    s = schema('''
    def tool_v(a: int, **kwargs):
        """Doc.

        a (int): the a
        b (str): not a parameter
        """
    ''')
    assert list(s["properties"]) == ["a"]


def test_no_docstring_no_parameters():
    assert schema("def tool_n(*args, **kwargs):\n    pass\n") == {"type": "object", "properties": {},
                                                                "required": []}


# ------------------------------------------------------------------- misc
def test_parse_source_metadata():
    parsed = parse_source(textwrap.dedent('''
        TOOL_LIBRARY_NAME = "My Library"
        TOOL_LIBRARY_ALIASES = ["mylib", 'My-Lib']
        TOOL_LIBRARY_LOAD_FLAG = "enable_mine"
        def tool_a():
            pass
    '''))
    assert parsed.display_name == "My Library"
    assert parsed.aliases == ["mylib", "My-Lib"]
    assert parsed.load_flag == "enable_mine"


@pytest.mark.parametrize("raw, expected", [
    ("Web Search", "web_search"), ("tool_web-search", "web_search"), ("  A  -B ", "a_b"),
    ("", ""), (None, ""),
])
def test_normalize_library_name(raw, expected):
    assert discovery.normalize_library_name(raw) == expected


def test_dynamic_library_parses_without_running():
    lib, parsed = discovery.dynamic_library("pre", "raise SystemExit\n" + tool_src("tool_dyn", "Dyn.", "n: int"))
    assert lib.dynamic and lib.name == "pre" and lib.files == ()
    assert [t.spec["name"] for t in parsed.tools] == ["tool_dyn"]
    with pytest.raises(SyntaxError):
        discovery.dynamic_library("pre", "def tool_bad(:\n")


# ----------------------------------------------------------- warnings name the file
def test_a_file_that_does_not_parse_is_named_with_its_line(tmp_path, caplog):
    bad = write(tmp_path, "broken.py", tool_src("tool_ok") + "def tool_bad(:\n    pass\n")
    with caplog.at_level(logging.WARNING, logger="lcp_sandbox.discovery"):
        found = run(tmp_path)
    assert "tool_ok" in names(found)                                  # the regex fallback still read it
    messages = [r.getMessage() for r in caplog.records if "regex fallback" in r.getMessage()]
    assert len(messages) == 1
    assert messages[0].startswith(f"{bad.resolve()}, line 5: ") and "<unknown>" not in messages[0]


def test_a_missing_tools_folder_or_file_is_named(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="lcp_sandbox.discovery"):
        found = run(tmp_path / "no_such_folder", tool_files=[tmp_path / "no_such_file.py"])
    assert found.specs == []
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"tools folder {tmp_path / 'no_such_folder'} skipped: it does not exist" in text
    assert f"tool file {tmp_path / 'no_such_file.py'} skipped: it does not exist" in text
