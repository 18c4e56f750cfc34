"""Tool schemas from source text: the AST reading of ``def tool_*`` and the regex fallback.

Pure code: nothing here imports or runs a tool file.

    parse_source(text) ── ast.parse ─ok─► schema_from_function() per def tool_* (source order,
                              │                                   nested ones included)
                              └─fail─► regex_tools()  (lossy, never raises)
                          + the file's TOOL_LIBRARY_LOAD_FLAG / _NAME / _ALIASES (regex)
                      ──► ParsedFile(tools, function names, metadata)
"""
from __future__ import annotations

import ast
import logging
import re
from dataclasses import dataclass
from typing import Any, Optional

from ..protocol import HOST_PARAMS

log = logging.getLogger("lcp_sandbox.discovery")

#: Parameters the host injects into a tool that declares them.
#: Never shown to the LLM.
HIDDEN_PARAMS = HOST_PARAMS | {"args", "kwargs"}
#: Names in a docstring that are section headers, not parameters.
_DOC_SECTION_WORDS = frozenset({"args", "parameters", "returns", "example"})

# `name (type): desc`, `name: desc`, `name - desc`, optionally bulleted.
_DOC_PARAM_RE = re.compile(r"^(?:[-*\d.]+\s*)?([A-Za-z0-9_]+)\s*(?:\(([^)]+)\))?\s*[:\-]\s*(.+)")
_REGEX_DEF_RE = re.compile(r"^[ \t]*def\s+(tool_\w+)\s*\(([^)]*)\)\s*(?:->\s*[^:]+)?:",
                           re.MULTILINE)
_REGEX_DOC_RE = re.compile(r'"""(.*?)"""', re.DOTALL)
_LOAD_FLAG_RE = re.compile(r"^TOOL_LIBRARY_LOAD_FLAG\s*=\s*[\"']([A-Za-z0-9_]+)[\"']", re.MULTILINE)
_DISPLAY_NAME_RE = re.compile(r"^TOOL_LIBRARY_NAME\s*=\s*[\"']([^\"']+)[\"']", re.MULTILINE)
_ALIASES_RE = re.compile(r"^TOOL_LIBRARY_ALIASES\s*=\s*[\[(](.*?)[\])]", re.MULTILINE | re.DOTALL)


def json_type(annotation: str) -> str:
    """Map an annotation's text to a JSON schema type (lower-cased substring rule)."""
    a = annotation.lower()
    if "int" in a:
        return "integer"
    if "float" in a or "number" in a:
        return "number"
    if "bool" in a:
        return "boolean"
    if "list" in a or "array" in a:
        return "array"
    if "dict" in a or "object" in a:
        return "object"
    return "string"


def _doc_type(type_text: str) -> str:
    # Docstring-declared parameters only know these three (as upstream).
    t = type_text.lower()
    if "int" in t:
        return "integer"
    if "float" in t:
        return "number"
    if "bool" in t:
        return "boolean"
    return "string"


def _doc_params(docstring: str) -> dict[str, tuple[Optional[str], str]]:
    """name -> (type text, description) for every parameter-looking line; last one wins."""
    found: dict[str, tuple[Optional[str], str]] = {}
    for line in docstring.splitlines():
        m = _DOC_PARAM_RE.match(line.strip())
        if m:
            found[m.group(1).strip()] = (m.group(2), m.group(3).strip())
    return found


@dataclass
class ToolDef:
    """What the host knows about one tool without running it."""
    # The LCP spec (public keys + private `_` keys)
    spec: dict[str, Any]
    # Defaults that are real literals: filled in on call.
    literal_defaults: dict[str, Any]
    # Parameters the LLM can see (prompt-provider rule)
    llm_param_count: int


def schema_from_function(node: ast.FunctionDef) -> ToolDef:
    """Build the LCP spec of one ``def tool_*`` node: description from the docstring's
    first paragraph, a JSON-schema property per parameter the LLM may pass."""
    docstring = ast.get_docstring(node) or ""
    if docstring:
        description = docstring.strip().split("\n\n")[0].strip()
    else:
        description = "No description provided."
    doc = _doc_params(docstring) if docstring else {}

    properties: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    literal_defaults: dict[str, Any] = {}

    a = node.args
    # Defaults cover the last positional parameters, positional-only ones included;
    # those cannot be passed by keyword, so they are not in the schema. Keyword-only
    # parameters follow (upstream drops them; we show them, see docs/lollms.md).
    positional = a.posonlyargs + a.args
    pos_defaults: list[Optional[ast.expr]] = [None] * (len(positional) - len(a.defaults))
    pos_defaults += a.defaults
    params = (list(zip(positional, pos_defaults, strict=True))[len(a.posonlyargs):]
              + list(zip(a.kwonlyargs, a.kw_defaults, strict=True)))
    for arg, default in params:
        name = arg.arg
        if name in HIDDEN_PARAMS:
            continue
        kind = json_type(ast.unparse(arg.annotation).strip()) if arg.annotation else "string"
        prop: dict[str, Any] = {"type": kind,
                                "description": doc.get(name, (None, f"Parameter '{name}'"))[1]}
        if default is not None:
            try:
                value = ast.literal_eval(default)
                literal_defaults[name] = value
            except Exception:
                value = ast.unparse(default).strip("'\"")
            prop["default"] = value
        else:
            required.append(name)
        properties[name] = prop
    llm_param_count = len(properties)

    if not properties and docstring:
        # A function with no visible parameters (e.g. only **kwargs) may declare
        # them in its docstring.
        for name, (type_text, desc) in doc.items():
            if name.lower() in _DOC_SECTION_WORDS or name in HIDDEN_PARAMS:
                continue
            type_text = (type_text or "string").lower().strip()
            properties[name] = {"type": _doc_type(type_text), "description": desc}
            if "optional" not in type_text and "default" not in type_text:
                required.append(name)

    spec = {
        "name": node.name,
        "description": description,
        "input_schema": {"type": "object", "properties": properties, "required": required},
    }
    return ToolDef(spec, literal_defaults, llm_param_count)


def regex_tools(text: str) -> list[ToolDef]:
    """Lossy extraction for files ``ast`` cannot parse.  Never raises."""
    tools: list[ToolDef] = []
    try:
        for m in _REGEX_DEF_RE.finditer(text):
            name, params_text = m.group(1), m.group(2)
            doc_m = _REGEX_DOC_RE.search(text[m.end():m.end() + 4000])
            docstring = doc_m.group(1).strip() if doc_m else ""
            description = docstring.split("\n\n")[0].strip() if docstring else f"Executes {name}."
            properties: dict[str, dict[str, Any]] = {}
            required: list[str] = []
            for raw in params_text.split(","):
                param = raw.strip()
                if not param or param.startswith("*") or param == "/":
                    continue
                if ":" in param:
                    pname, rest = (x.strip() for x in param.split(":", 1))
                    entry = {"type": json_type(rest), "description": f"Parameter '{pname}'"}
                    default_m = re.search(r"=\s*(.+)$", param)
                    if default_m:
                        entry["default"] = default_m.group(1).strip().strip("'\"")
                else:
                    pname = param.split("=")[0].strip()
                    entry = {"type": "string", "description": f"Parameter '{pname}'"}
                if not pname or pname in HIDDEN_PARAMS:
                    continue
                if "=" not in param:
                    required.append(pname)
                properties[pname] = entry
            spec = {
                "name": name,
                "description": description,
                "input_schema": {"type": "object", "properties": properties, "required": required},
                "_parsed_via_regex_fallback": True,
            }
            tools.append(ToolDef(spec, {}, len(properties)))
    # The fallback must never raise.
    except Exception as exc:
        log.warning("regex fallback stopped early: %s", exc)
    return tools


@dataclass
class ParsedFile:
    """Everything discovery needs from one file, cached by (mtime, size)."""
    tools: list[ToolDef]
    # Every def name in the file (prompt providers)
    function_names: frozenset[str]
    load_flag: Optional[str]
    display_name: str
    aliases: list[str]
    via_regex: bool = False


def parse_source(text: str, path: Any = None) -> ParsedFile:
    """Tools and metadata of one file's source; ``path`` only names it in warnings."""
    load_flag = _LOAD_FLAG_RE.search(text)
    display = _DISPLAY_NAME_RE.search(text)
    aliases_m = _ALIASES_RE.search(text)
    aliases = re.findall(r"[\"']([^\"']+)[\"']", aliases_m.group(1)) if aliases_m else []
    flag = load_flag.group(1) if load_flag else None
    display_name = display.group(1) if display else ""
    try:
        tree = ast.parse(text)
        tools: list[ToolDef] = []
        names: set[str] = set()
        _walk_defs(tree, tools, names)
        return ParsedFile(tools, frozenset(names), flag, display_name, aliases)
    except Exception as exc:
        where = path or "tool source"
        if isinstance(exc, SyntaxError) and exc.lineno:
            log.warning("%s, line %d: %s; its tools are read with the regex fallback",
                        where, exc.lineno, exc.msg)
        else:
            log.warning("%s: cannot be parsed (%s); its tools are read with the regex fallback",
                        where, exc)
        tools = regex_tools(text)
        return ParsedFile(tools, frozenset(t.spec["name"] for t in tools), flag, display_name,
                          aliases, via_regex=True)


def _walk_defs(node: ast.AST, tools: list[ToolDef], names: set[str]) -> None:
    # Source order, nested functions included (depth first).
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(child.name)
        if isinstance(child, ast.FunctionDef) and child.name.startswith("tool_"):
            tools.append(schema_from_function(child))
        _walk_defs(child, tools, names)



def parse_code(code: str) -> ParsedFile:
    """Code given at run time (``register_tool_from_code``): a syntax error is raised."""
    tree = ast.parse(code)
    tools: list[ToolDef] = []
    names: set[str] = set()
    _walk_defs(tree, tools, names)
    return ParsedFile(tools, frozenset(names), None, "", [])
