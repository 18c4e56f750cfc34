"""Where things are: the package's lollms binding folder, the bundled tools,
lollms_client's default tools (found without importing lollms_client)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Optional

# lcp_sandbox/
_PACKAGE = Path(__file__).resolve().parent.parent


def lollms_bindings_dir() -> Path:
    """Pass as ``LollmsClient(tools_bindings_dir=...)`` with ``tools_binding_name="sandboxed"``."""
    return _PACKAGE / "lollms_bindings"


def bundled_tools_dir() -> Path:
    """The example libraries shipped with lcp_sandbox."""
    here = _PACKAGE
    for candidate in (here / "bundled_tools", here.parent / "tools"):
        if candidate.is_dir():
            return candidate
    return here.parent / "tools"


def lollms_default_tools_dir() -> Optional[Path]:
    """lollms_client's own default_tools folder, found without importing lollms_client."""
    try:
        spec = importlib.util.find_spec("lollms_client")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "tools_bindings" / "lcp" / "default_tools"
    return d if d.is_dir() else None


def as_paths(value: Any) -> list[Path]:
    """A folder, a file, or a list of them, as a list of Paths (as LCPBinding takes them)."""
    if not value:
        return []
    if isinstance(value, (str, Path)):
        return [Path(value)]
    return [Path(v) for v in value]
