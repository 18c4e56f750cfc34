"""LCP <-> MCP: the pure half of the MCP server (no processes, no SDK, no I/O but parsing).

    LCP spec {"name", "description", "input_schema", "_..."}
        ──tool_entry──► MCP Tool (inputSchema)
    LCP result {"output", "success", "status_code", ...}
        ──call_result──► content, structuredContent, isError
    confirm_handler(source, script_label, argv)
        ──confirm_form──► elicitation form
    elicitation answer (accept/decline/cancel)
        ──confirm_decision──► ("allow"|"always"|"reject", reason)
    user_interaction_handler({"type", "title", "prompt", ...})
        ──ask_form──► form ──ask_answer──► str | None

mcp_server.py does the talking; everything here is plain data in, plain data out.
"""
from __future__ import annotations

import ast
import base64
import binascii
import json
import math
import os
from typing import Any, Optional

#: What every failure text of an unknown tool / bad arguments looks like (as the SDK's
#: MCPServer answers an unknown tool, and the 1.x low-level server answered bad input).
UNKNOWN_TOOL = "Unknown tool: {name}"
INVALID_INPUT = "Input validation error: {message}"

# Characters of a tool's source / prompt shown in a form.
_MAX_FORM_TEXT = 4000
# Characters of a label or title (tools are untrusted:
_MAX_TITLE = 300
                               # keep forms sane)
# Choices of a select.
_MAX_OPTIONS = 200


# ---------------------------------------------------------------- JSON safety
def json_safe(value: Any, _depth: int = 0) -> Any:
    """``value`` as plain JSON data: tuples and sets become lists, dict keys strings,
    bytes their UTF-8 text (or base64 when not UTF-8), non-finite floats and any
    other object their ``str()``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if _depth > 64:
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, _depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [json_safe(v, _depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode("ascii")
    return str(value)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(json_safe(value), ensure_ascii=False)


# ---------------------------------------------------------------- tools/list
_literal_cache: dict[tuple, dict[str, frozenset]] = {}


def literal_default_names(path: str, function: str) -> frozenset:
    """Parameters of ``def function`` in ``path`` whose default is a Python literal.

    LCP specs carry a default that is not a literal (``Path(".")``, a constant's
    name) as its source text, which reads like a string default: only the source
    tells them apart.  Empty when the file cannot be read or parsed."""
    try:
        st = os.stat(path)
    except OSError:
        return frozenset()
    key = (path, st.st_mtime_ns, st.st_size)
    per_file = _literal_cache.get(key)
    if per_file is None:
        per_file = {}
        try:
            with open(path, "rb") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.name not in per_file):
                a = node.args
                positional = a.posonlyargs + a.args
                defaulted = positional[len(positional) - len(a.defaults):]
                pairs = list(zip(defaulted, a.defaults, strict=True))
                pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                          if d is not None]
                names = set()
                for arg, default in pairs:
                    try:
                        ast.literal_eval(default)
                        names.add(arg.arg)
                    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                        pass
                per_file[node.name] = frozenset(names)
        if len(_literal_cache) > 1024:
            _literal_cache.clear()
        _literal_cache[key] = per_file
    return per_file.get(function, frozenset())


def _literal_default(spec: dict, param: str, value: Any) -> bool:
    if not isinstance(value, str):
        # Only literals reach a spec as anything but text.
        return True
    if spec.get("_parsed_via_regex_fallback") or not spec.get("_python_file_path"):
        return False
    return param in literal_default_names(str(spec["_python_file_path"]), str(spec.get("name")))


def tool_entry(spec: dict) -> dict:
    """The MCP tool of an LCP spec: ``{"name", "description", "inputSchema"}``.

    The input schema keeps the LCP parameters (types, ``required``, descriptions)
    and only the defaults that are literals; private ``_`` keys are dropped."""
    schema = spec.get("input_schema") or {}
    properties = {}
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        out = {k: json_safe(v) for k, v in prop.items() if k != "default"}
        out.setdefault("type", "string")
        default = prop.get("default")
        if "default" in prop and _literal_default(spec, name, default) and \
                not (isinstance(default, float) and not math.isfinite(default)):
            out["default"] = json_safe(default)
        properties[str(name)] = out
    required = [str(r) for r in schema.get("required") or () if r in properties]
    return {"name": str(spec["name"]), "description": str(spec.get("description") or ""),
            "inputSchema": {"type": "object", "properties": properties, "required": required}}


def validation_schema(input_schema: dict) -> dict:
    """The schema arguments are checked against: the advertised one, where a
    parameter whose default is ``None`` also takes ``null`` (an ``Optional``)."""
    properties = {}
    for name, prop in input_schema.get("properties", {}).items():
        prop = dict(prop)
        if "default" in prop and prop["default"] is None and isinstance(prop.get("type"), str):
            prop["type"] = [prop["type"], "null"]
        properties[name] = prop
    return {**input_schema, "properties": properties}


# ---------------------------------------------------------------- tools/call
def _image_blocks(result: dict) -> list[dict]:
    raw = result.get("image_media_types")
    types = [raw] if isinstance(raw, str) else \
        [t for t in raw if isinstance(t, str)] if isinstance(raw, (list, tuple)) else []
    images = []
    if isinstance(result.get("image_b64"), str):
        images.append(result["image_b64"])
    if isinstance(result.get("images"), (list, tuple)):
        images += [i for i in result["images"] if isinstance(i, str)]
    blocks = []
    for i, data in enumerate(images):
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            # A path or a name, not image data: it stays in.
            continue
                                       # structuredContent
        mime = types[i] if i < len(types) else (types[-1] if types else "image/png")
        blocks.append({"type": "image", "data": data, "mimeType": mime})
    return blocks


def call_result(result: Any) -> tuple[list[dict], dict, bool]:
    """``(content, structuredContent, isError)`` of an LCP result dict.

    ``content``: the output as text (JSON text when it is not a string), then, for
    a failure, the error when the output does not already say it, then the
    images of the pass-through keys.  ``structuredContent``: the whole result,
    JSON-safe.  ``isError``: the call did not succeed."""
    if not isinstance(result, dict):
        result = {"output": result, "success": True, "status_code": 200}
    structured = json_safe(result)
    is_error = result.get("success") is not True
    output = result.get("output")
    error = result.get("error")
    if output is not None:
        text = _as_text(output)
    else:
        text = _as_text(error) if error is not None else ""
    content = [{"type": "text", "text": text}]
    if is_error and error is not None:
        error_text = _as_text(error)
        if error_text and error_text not in text:
            content.append({"type": "text", "text": error_text})
    content += _image_blocks(result)
    return content, structured, is_error


# ---------------------------------------------------------------- confirmation
def confirm_request(args: tuple, kwargs: dict) -> tuple[str, str, Any]:
    """``(source, script_label, argv)`` from the ways tools call a confirm handler:
    ``(source, script_label[, argv])``, keywords, or one dict."""
    if len(args) == 1 and isinstance(args[0], dict):
        req = args[0]
        source = req.get("source") or req.get("content") or _as_text(req)
        label = req.get("script_label") or req.get("label") or req.get("action") or "a tool action"
        return str(source), str(label), req.get("argv")
    source = args[0] if args else kwargs.get("source", kwargs.get("content", ""))
    if len(args) > 1:
        label = args[1]
    else:
        label = kwargs.get("script_label", kwargs.get("label", "a tool action"))
    argv = args[2] if len(args) > 2 else kwargs.get("argv")
    return str(source), str(label), argv


def _clip(text: str, limit: int = _MAX_FORM_TEXT) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f" [... {len(text) - limit} more characters]"


def confirm_form(source: str, script_label: str, argv: Any = None) -> tuple[str, dict]:
    """The elicitation form (message, requestedSchema) of a confirmation."""
    message = f"A tool asks for your confirmation: {_clip(script_label, _MAX_TITLE)}"
    if source and source != script_label:
        message += f"\n\n{_clip(source)}"
    if argv:
        command = list(argv) if isinstance(argv, tuple) else argv
        message += f"\n\nCommand: {_clip(_as_text(command))}"
    schema = {
        "type": "object",
        "properties": {
            "decision": {
                "type": "string", "title": "Decision",
                "description": "allow: run it once; always: run it and stop asking for this tool "
                               "library in this session; reject: do not run it",
                "oneOf": [{"const": "allow", "title": "Allow once"},
                          {"const": "always", "title": "Always allow (this session)"},
                          {"const": "reject", "title": "Reject"}],
            },
            "reason": {"type": "string", "title": "Reason",
                       "description": "Optional; the tool reports it with a rejection"},
        },
        "required": ["decision"],
    }
    return message, schema


def confirm_decision(action: str, content: Optional[dict]) -> tuple[str, str]:
    """The confirm handler's answer to an elicitation's outcome: accept carries the
    decision; decline, cancel and anything unrecognized are a rejection."""
    if action == "accept":
        content = content if isinstance(content, dict) else {}
        decision = str(content.get("decision") or "").strip().lower()
        reason = content.get("reason")
        reason = "" if reason is None else str(reason)
        if decision in ("allow", "always", "reject"):
            return decision, reason
        return "reject", f"The confirmation form came back without a valid decision ({decision!r})."
    if action == "decline":
        return "reject", "The user declined the action."
    if action == "cancel":
        return "reject", "The user dismissed the confirmation request without answering."
    return "reject", f"The confirmation request failed: {action}"


# ---------------------------------------------------------------- user interaction
def ask_request(args: tuple, kwargs: dict) -> dict:
    """The request of a user-interaction call: one dict ``{"type", "title", "prompt",
    "options", "default"}`` (lollms' shape), or a prompt and keywords."""
    if len(args) == 1 and isinstance(args[0], dict):
        return dict(args[0])
    req = dict(kwargs)
    if args:
        req.setdefault("prompt", str(args[0]))
    return req


def ask_form(request: dict) -> Optional[tuple[str, dict]]:
    """The elicitation form of a user-interaction request, or None for a secret:
    MCP forbids asking for sensitive data in a form (the tool gets no answer)."""
    kind = str(request.get("type") or "text").lower()
    if kind in ("secret", "password"):
        return None
    title = _clip(str(request.get("title") or "Input requested"), _MAX_TITLE)
    prompt = str(request.get("prompt") or "")
    prop: dict = {"type": "string", "title": title}
    if prompt:
        prop["description"] = _clip(prompt)
    options = request.get("options")
    if kind == "select" and isinstance(options, (list, tuple)) and options:
        prop["enum"] = [_clip(str(o), _MAX_TITLE) for o in options[:_MAX_OPTIONS]]
    default = request.get("default")
    if isinstance(default, str) and default and ("enum" not in prop or default in prop["enum"]):
        prop["default"] = default
    message = _clip(prompt) if prompt else title
    return message, {"type": "object", "properties": {"answer": prop}, "required": ["answer"]}


def ask_answer(action: str, content: Optional[dict]) -> Optional[str]:
    """The handler's answer: the text the user gave, or None (declined, cancelled)."""
    if action != "accept" or not isinstance(content, dict) or content.get("answer") is None:
        return None
    return str(content["answer"])
