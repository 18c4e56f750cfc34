"""lcp_sandbox: run LCP tool libraries in long-lived, isolated worker processes.

``SandboxedBinding`` is a drop-in for lollms_client's in-process ``LCPBinding``;
``Supervisor`` owns the worker processes and may be shared between bindings.
"""
from .binding import SandboxedBinding, bundled_tools_dir
from .limits import Limits
from .supervisor import CrashPolicy, SandboxEvent, Supervisor

__all__ = ["SandboxedBinding", "Supervisor", "Limits", "CrashPolicy", "SandboxEvent", "bundled_tools_dir"]
__version__ = "0.1.0"
