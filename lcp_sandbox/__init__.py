"""lcp_sandbox: run LCP tool libraries in long-lived, isolated worker processes.

``SandboxedBinding`` is a drop-in for lollms_client's in-process ``LCPBinding``
(and a ``LollmsToolBinding`` when lollms_client is installed);
``Supervisor`` owns the worker processes and may be shared between bindings.

Attributes are imported lazily: the zygote imports ``lcp_sandbox.worker``
and must not pay for the binding (or lollms_client) it never uses.
"""
from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "SandboxedBinding": "binding", "bundled_tools_dir": "binding", "lollms_bindings_dir": "binding",
    "Supervisor": "supervisor", "CrashPolicy": "supervisor", "SandboxEvent": "supervisor",
    "Limits": "limits",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lcp_sandbox' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
