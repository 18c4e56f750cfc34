"""lcp_sandbox: run LCP tool libraries in long-lived, isolated worker processes.

``SandboxedBinding`` is a drop-in for lollms_client's in-process ``LCPBinding``
(``lollms_binding_class()`` is its ``LollmsToolBinding`` subclass, the class
lollms' loader gets); ``Supervisor`` owns the worker processes and may be shared
between bindings; ``RaySupervisor`` runs a ``Supervisor`` on every node of a Ray
cluster (the ``ray`` extra; ray is imported only when it is first used).

Attributes are imported lazily: the zygote imports ``lcp_sandbox.worker``
and must not pay for the binding it never uses.  Nothing here imports
lollms_client until lollms asks for the binding.

The package logs on the ``lcp_sandbox`` logger, which has a ``NullHandler``:
nothing reaches stderr unless the host configures logging.
"""
import logging
from importlib import import_module
from typing import Any

# The public version.
from .core.version import __version__ as __version__

logging.getLogger(__name__).addHandler(logging.NullHandler())

_EXPORTS = {
    # the binding comes through its lollms front, which registers (without importing
    # lollms_client) the subclass a binding made after lollms_client is loaded becomes
    "SandboxedBinding": "fronts.lollms", "lollms_binding_class": "fronts.lollms",
    "bundled_tools_dir": "binding.locations", "lollms_bindings_dir": "binding.locations",
    "Supervisor": "backends.local", "CrashPolicy": "backends.local",
    "RaySupervisor": "backends.ray.driver", "SandboxEvent": "core.outcomes",
    "Limits": "core.limits",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lcp_sandbox' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
