"""
risky_ops.py — file operations gated by operator confirmation (human in the loop).

Tools: ``tool_delete_file`` and ``tool_move_file`` are *risky* (they destroy
or displace data); ``tool_file_info`` is *safe* (read-only).  All paths must
stay inside the workspace (the current working directory at call time).

Autonomy levels (host config ``host_tool_configs["risky_ops"]["autonomy_level"]``,
default ``"safe"``; an unknown value also means ``"safe"``):

    strict       every action, safe ones included, asks the operator
    safe         risky actions ask the operator; safe actions run
    full_access  nothing asks

Confirmation contract (as lollms' system_shell): the host's handler is called
as ``handler(source, script_label, argv)`` and returns ``(decision, reason)``:

    "allow"   run this action once
    "always"  run it and upgrade the session to full_access: later actions
              of this library stop asking
    "reject"  do not run it; ``reason`` is returned to the LLM in the failure

The handler is received through ``set_confirm_handler(handler)`` (also kept
in the module-level ``_CONFIRM_HANDLER``) or the ``confirm_handler`` key of
the config given to ``init_tools_library``.  Without a handler, actions that
need confirmation are refused with an explanatory error (never run silently).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

TOOL_LIBRARY_NAME = "Risky Operations"
TOOL_LIBRARY_DESC = "Deletes, moves and inspects workspace files; destructive actions require operator confirmation."
TOOL_LIBRARY_ICON = "⚠️"

AUTONOMY_LEVELS = ("strict", "safe", "full_access")
AUTONOMY_LEVEL: str = "safe"
_CONFIRM_HANDLER: Optional[Callable] = None
_HASH_MAX_BYTES = 64 * 1024 * 1024


def set_confirm_handler(handler: Optional[Callable]) -> None:
    """Installs (or clears, with None) the host's confirmation handler."""
    global _CONFIRM_HANDLER
    _CONFIRM_HANDLER = handler


def init_tools_library(config: Optional[dict] = None) -> None:
    """Reads the host configuration: autonomy_level and, optionally, confirm_handler."""
    global AUTONOMY_LEVEL
    AUTONOMY_LEVEL = "safe"
    if not isinstance(config, dict):
        return
    level = str(config.get("autonomy_level") or "safe").strip().lower()
    AUTONOMY_LEVEL = level if level in AUTONOMY_LEVELS else "safe"
    if "confirm_handler" in config:
        set_confirm_handler(config.get("confirm_handler"))


def tool_risky_ops_prompt() -> str:
    """Dynamic library context: the current autonomy level (not a tool)."""
    rules = {
        "strict": "every action, including tool_file_info, must be approved by the operator",
        "safe": "tool_delete_file and tool_move_file must be approved by the operator",
        "full_access": "actions run without asking the operator",
    }[AUTONOMY_LEVEL if AUTONOMY_LEVEL in AUTONOMY_LEVELS else "safe"]
    return (f"Risky operations autonomy level: {AUTONOMY_LEVEL} — {rules}. "
            "If the operator rejects an action, do not retry it: report the operator's reason.")


# ---------------------------------------------------------------- helpers
def _fail(message: str) -> Dict[str, Any]:
    """The failure shape; ``output`` repeats the error so the LLM never sees a success text."""
    return {"success": False, "error": message, "output": f"Error: {message}"}

def _to_bool(value: Any, default: bool) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "1", "yes", "y", "on", "t"):
            return True
        if text in ("false", "0", "no", "n", "off", "f", "", "none", "null"):
            return False
    return default


def _resolve_safe_path(name: Any) -> Path:
    """Resolve ``name`` inside the workspace (never the workspace itself) or raise PermissionError."""
    root = Path.cwd().resolve()
    raw = "" if name is None else str(name).strip().replace("\\", "/")
    if not raw or raw in (".", "./"):
        raise PermissionError("A file path inside the workspace is required (got the workspace itself).")
    if "\x00" in raw:
        raise PermissionError(f"Invalid path {raw!r}.")
    candidate = Path(raw)
    if not candidate.is_absolute():
        candidate = root / candidate
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError) as exc:
        raise PermissionError(f"Cannot resolve path '{raw}': {exc}") from None
    if root not in resolved.parents:
        raise PermissionError(f"Access denied: path '{raw}' is outside the workspace.")
    return resolved


def _operand(name: Any) -> Path:
    """The path a delete/move acts on: like _resolve_safe_path, except that a final
    component which is a symlink (pointing inside the workspace) is the link itself,
    so deleting or moving a link never touches its target."""
    resolved = _resolve_safe_path(name)
    raw = str(name).strip().replace("\\", "/")
    candidate = Path(raw)
    if not candidate.is_absolute():
        candidate = Path.cwd().resolve() / candidate
    if candidate.name not in ("", ".", "..") and candidate.is_symlink():
        link = candidate.parent.resolve() / candidate.name
        if Path.cwd().resolve() in link.parents:
            return link
    return resolved


def _rel(path: Path) -> str:
    return path.relative_to(Path.cwd().resolve()).as_posix()


def _parse_decision(result: Any) -> Tuple[str, str]:
    """The handler's answer as (decision, reason); anything unrecognized is a rejection."""
    if isinstance(result, (tuple, list)) and result:
        decision = result[0]
        reason = result[1] if len(result) > 1 and result[1] is not None else ""
    elif isinstance(result, bool):
        decision, reason = ("allow", "") if result else ("reject", "")
    elif isinstance(result, str):
        decision, reason = result, ""
    else:
        return "reject", f"The confirmation handler gave no decision ({result!r})."
    decision = str(decision).strip().lower()
    if decision not in ("allow", "always", "reject"):
        return "reject", f"The confirmation handler gave an unknown decision {decision!r}."
    return decision, str(reason)


def _authorize(action: str, source: str, argv: List[str], risky: bool) -> Optional[Dict[str, Any]]:
    """Ask the operator when the autonomy level requires it.

    Returns None when the action may run, else the failure result to return."""
    global AUTONOMY_LEVEL
    level = AUTONOMY_LEVEL if AUTONOMY_LEVEL in AUTONOMY_LEVELS else "safe"
    if level == "full_access" or (level == "safe" and not risky):
        return None
    handler = _CONFIRM_HANDLER
    if handler is None or not callable(handler):
        return _fail(f"Operator confirmation is required to {action} ('{level}' autonomy level) but the "
                     "host configured no confirmation handler, so the action was refused. "
                     "Ask the operator to approve it or to change the autonomy level.")
    label = f"[{level.upper()}] risky_ops: {action}"
    try:
        decision, reason = _parse_decision(handler(source, label, list(argv)))
    except Exception as exc:     # a failing handler must never mean "allowed"
        decision, reason = "reject", f"The confirmation handler failed: {exc}"
    if decision == "always":
        AUTONOMY_LEVEL = "full_access"
        return None
    if decision == "allow":
        return None
    return {"success": False,
            "error": f"The operator rejected the request to {action}: {reason or 'no reason given'}.",
            "output": (f"BLOCKED: the operator did not authorize the request to {action}. "
                       f"Reason: {reason or 'no reason given'}. Do not retry it without the operator's consent.")}


# ---------------------------------------------------------------- tools
def tool_file_info(file_name: str) -> Dict[str, Any]:
    """
    Returns information about a workspace file or folder: type, size, modification time and SHA-256.

    Args:
        file_name (str): Workspace-relative path of the file or folder.
    """
    try:
        path = _resolve_safe_path(file_name)
    except PermissionError as exc:
        return _fail(str(exc))
    if not path.exists():
        return _fail(f"'{file_name}' not found in the workspace.")
    rel = _rel(path)
    denied = _authorize(f"inspect '{rel}'", f"Inspect workspace path '{rel}' (read-only).",
                        ["file_info", rel], risky=False)
    if denied:
        return denied
    st = path.stat()
    info: Dict[str, Any] = {
        "path": rel,
        "type": "directory" if stat.S_ISDIR(st.st_mode) else "file",
        "size": st.st_size,
        "modified": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(st.st_mtime)),
    }
    if info["type"] == "file" and st.st_size <= _HASH_MAX_BYTES:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        info["sha256"] = h.hexdigest()
    elif info["type"] == "directory":
        info["entries"] = sum(1 for _ in os.scandir(path))
    return {"success": True, "output": info}


def tool_delete_file(file_name: str) -> Dict[str, Any]:
    """
    Deletes a file of the workspace. This is irreversible and may require operator approval.

    Args:
        file_name (str): Workspace-relative path of the file to delete.
    """
    try:
        path = _operand(file_name)
    except PermissionError as exc:
        return _fail(str(exc))
    if not path.exists() and not path.is_symlink():
        return _fail(f"File '{file_name}' not found in the workspace.")
    if not path.is_file():
        return _fail(f"'{file_name}' is not a file; only files can be deleted.")
    rel = _rel(path)
    size = path.lstat().st_size
    denied = _authorize(f"delete '{rel}'",
                        f"Delete the workspace file '{rel}' ({size:,} bytes). This cannot be undone.",
                        ["delete_file", rel], risky=True)
    if denied:
        return denied
    try:
        path.unlink()
    except OSError as exc:
        return _fail(f"Cannot delete '{rel}': {exc}")
    return {"success": True, "output": f"Deleted '{rel}' ({size:,} bytes)."}


def tool_move_file(source: str, destination: str, overwrite: bool = False) -> Dict[str, Any]:
    """
    Moves or renames a workspace file. May require operator approval.

    Args:
        source (str): Workspace-relative path of the file to move.
        destination (str): Workspace-relative destination path (an existing folder keeps the file name).
        overwrite (bool): Whether an existing destination file may be replaced.
    """
    try:
        src = _operand(source)
        dst = _resolve_safe_path(destination)
    except PermissionError as exc:
        return _fail(str(exc))
    if not (src.is_file() or src.is_symlink()):
        return _fail(f"Source file '{source}' not found in the workspace.")
    if dst.is_dir():
        dst = dst / src.name
    if dst == src:
        return _fail(f"Source and destination are the same file ('{_rel(src)}').")
    overwrite = _to_bool(overwrite, False)
    replaces = dst.exists()
    if replaces and not overwrite:
        return _fail(f"Destination '{_rel(dst)}' already exists; set overwrite=true to replace it.")
    rel_src, rel_dst = _rel(src), _rel(dst)
    what = f"move '{rel_src}' to '{rel_dst}'"
    detail = f"Move the workspace file '{rel_src}' to '{rel_dst}'"
    detail += " (replacing the existing file)." if replaces else "."
    denied = _authorize(what, detail, ["move_file", rel_src, rel_dst], risky=True)
    if denied:
        return denied
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), str(dst))
    except OSError as exc:
        return _fail(f"Cannot {what}: {exc}")
    return {"success": True, "output": f"Moved '{rel_src}' to '{rel_dst}'."}
