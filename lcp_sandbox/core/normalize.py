"""LCP result shapes: the normalizer of tool results and the failure builders.

Pure code.  ``normalize`` gives a tool's return value the shape lollms_client's
``LCPBinding.execute_tool`` gives it (tests/core/test_normalize.py replays every case
through it); the other builders make
the failure results of sandbox events (a dead worker, a timeout...), which
share the LCP failure shape and carry their own ``status_code``.
"""
from __future__ import annotations

import os
from typing import Any, Optional

PASSTHROUGH_KEYS = ("image_filename", "image_b64", "images", "image_media_types",
                    "prompt_injection")
_PAYLOAD_KEYS = ("result", "data", "response", "papers", "content", "text")
_META_KEYS = frozenset({"success", "status", "error", "message", "return_code", "stderr"})
_FAILED_STATUSES = ("error", "failure", "failed")
_LOOKED_AT = _META_KEYS | {"output", "context_files", *_PAYLOAD_KEYS, *PASSTHROUGH_KEYS}

# Status codes of sandbox events (see docs/results.md).
NOT_FOUND = 404
TOOL_FAILED = 500
FORBIDDEN = 403
# Interrupted at the host's request (SandboxedBinding.interrupt)
CANCELLED = 499
UNAVAILABLE = 503
TIMED_OUT = 504
OUT_OF_MEMORY = 507


def resolve_context_files(value: Any, cwd: Optional[os.PathLike[str] | str] = None) -> list[str]:
    """Absolute paths of the existing files named by a tool's ``context_files``, relative
    ones against ``cwd`` (default: the process's)."""
    # Here, not at the top: a worker whose tools name no context files never imports
    # pathlib (with what it imports, about 10 ms of a spawned worker's start).
    from pathlib import Path
    base = Path(cwd) if cwd else Path.cwd()
    if isinstance(value, (str, Path)):
        entries = [value]
    elif isinstance(value, (list, tuple)):
        entries = list(value)
    else:
        return []
    out = []
    for entry in entries:
        try:
            p = Path(str(entry))
            p = (p if p.is_absolute() else base / p).resolve()
            if p.is_file():
                out.append(str(p))
        except Exception:
            continue
    return out


def normalize(result: Any, cwd: Optional[str] = None) -> dict[str, Any]:  # noqa: C901 (hot)
    """Turn whatever a tool returned into the LCP success or failure shape."""
    if type(result) is dict:
        # Two common shapes with nothing to look for (the same results as below): the
        # canonical success, and a plain dict with none of the keys looked at (its output).
        if len(result) == 2 and result.get("success") is True and "output" in result:
            return {"output": result["output"] or "Tool executed successfully (no output).",
                    "status_code": 200, "success": True}
        if result and result.keys().isdisjoint(_LOOKED_AT):
            return {"output": dict(result), "status_code": 200, "success": True}
    if not isinstance(result, dict):
        result = {"success": True, "output": result}
    else:
        # Never mutate the tool's own object.
        result = dict(result)
    failed = False
    error = None
    if result.get("success") is False:
        failed = True
        error = result.get("error") or result.get("message") or "Tool reported failure."
    status = str(result.get("status", "")).lower()
    if status in _FAILED_STATUSES:
        failed = True
        error = result.get("error") or result.get("message") or f"Tool status was '{status}'."
    rc = result.get("return_code")
    if rc is not None and rc != 0:
        failed = True
        error = result.get("error") or result.get("stderr") or f"Non-zero return code: {rc}"
    if result.get("error") and not failed and result.get("success") is not True:
        failed = True
        error = result["error"]

    if "output" not in result:
        payload = None
        for key in _PAYLOAD_KEYS:
            if key in result:
                payload = result[key]
                break
        if payload is None:
            rest = {k: v for k, v in result.items() if k not in _META_KEYS}
            payload = rest if rest else "Tool executed successfully."
        result["output"] = payload

    if failed:
        output = result.get("output") or result.get("error", "Tool failed.")
        return {"output": output, "error": error, "success": False, "status_code": TOOL_FAILED}

    final = {"output": result.get("output") or "Tool executed successfully (no output).",
             "status_code": 200, "success": True}
    for key in PASSTHROUGH_KEYS:
        if result.get(key) is not None:
            final[key] = result[key]
    if result.get("context_files") is not None:
        final["context_files"] = resolve_context_files(result["context_files"], cwd)
    return final


def crashed(tool: str, exc: BaseException, tb: str) -> dict[str, Any]:
    """A tool raised (any BaseException): the LCP crash shape."""
    msg = f"Tool '{tool}' crashed: {exc}"
    return {"output": {"success": False, "error": msg}, "error": msg, "traceback": tb,
            "success": False, "status_code": TOOL_FAILED}


def not_found(tool: str) -> dict[str, Any]:
    return {"error": f"Tool '{tool}' not found.", "status_code": NOT_FOUND}


def failure(message: str, status_code: int = TOOL_FAILED, **extra: Any) -> dict[str, Any]:
    """A sandbox event in the LCP failure shape."""
    out = {"output": message, "error": message, "success": False, "status_code": status_code}
    out.update(extra)
    return out
