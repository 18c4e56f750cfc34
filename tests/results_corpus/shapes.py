"""Tools returning every result shape the LCP normalizer knows, for the differential test."""
from pathlib import Path


def tool_canonical(text: str = "hi") -> dict:
    """Canonical success.

    Args:
        text (str): what to say
    """
    return {"success": True, "output": text}


def tool_plain_string(n: int = 3) -> str:
    """Returns a bare string."""
    return "x" * int(n)


def tool_plain_list() -> list:
    """Returns a list."""
    return [1, 2, {"a": None}]


def tool_none():
    """Returns None."""
    return None


def tool_empty_output() -> dict:
    """Success with an empty output."""
    return {"success": True, "output": ""}


def tool_explicit_failure() -> dict:
    """success False with an error."""
    return {"success": False, "error": "it broke"}


def tool_failure_message_only() -> dict:
    """success False with a message."""
    return {"success": False, "message": "said no"}


def tool_status_error() -> dict:
    """status error with output."""
    return {"status": "Failed", "output": "partial", "data": 1}


def tool_return_code() -> dict:
    """Non-zero return code with stderr."""
    return {"return_code": 2, "stderr": "bad flag", "stdout": "x"}


def tool_zero_return_code() -> dict:
    """Zero return code, output under 'result'."""
    return {"return_code": 0, "result": {"rows": 3}}


def tool_error_key() -> dict:
    """A truthy error without success."""
    return {"error": "soft error", "content": "c"}


def tool_error_but_success() -> dict:
    """success True wins over an error key."""
    return {"success": True, "error": "ignored", "output": "fine"}


def tool_payload_keys(which: str = "data") -> dict:
    """Output found under one of the payload keys.

    Args:
        which (str): result | data | response | papers | content | text
    """
    return {which: f"under {which}", "extra": 1}


def tool_meta_only() -> dict:
    """Only meta keys."""
    return {"success": True, "status": "ok", "message": "m"}


def tool_rest_as_output() -> dict:
    """No payload key: the rest becomes the output."""
    return {"success": True, "alpha": 1, "beta": [2]}


def tool_passthrough() -> dict:
    """Pass-through keys and context files."""
    Path("ctx.txt").write_text("c")
    return {"success": True, "output": "o", "prompt_injection": "pi", "image_filename": "i.png",
            "image_b64": "AAAA", "images": ["a"], "image_media_types": ["image/png"],
            "context_files": ["ctx.txt", "missing.txt"], "dropped": True}


def tool_raises(kind: str = "value") -> dict:
    """Raises.

    Args:
        kind (str): value | system_exit | keyboard
    """
    if kind == "system_exit":
        raise SystemExit(3)
    if kind == "keyboard":
        raise KeyboardInterrupt("ctrl-c")
    raise ValueError("bad value")


def tool_defaults(a: int, b: int = 2, c: str = "three", d: list = None) -> dict:
    """Shows the arguments it got.

    Args:
        a (int): required
        b (int): optional
        c (str): optional
        d (list): optional
    """
    return {"success": True, "output": [a, b, c, d]}


def tool_varkw(x: int = 0, **kwargs) -> dict:
    """Takes anything."""
    return {"success": True, "output": [x, sorted(kwargs.items())]}
