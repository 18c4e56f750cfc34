"""The lollms front: ``SandboxedBinding`` as lollms_client sees it.

    lcp_sandbox.SandboxedBinding(...)   ──►  binding.SandboxedBinding.__new__
        lollms_client's tools binding module already imported?  ──► the subclass
    lollms_binding_class()  ──► fronts/lollms_binding.py (imports lollms_client)
                                class SandboxedBinding(binding.SandboxedBinding, LollmsToolBinding)

Importing this module does not import lollms_client: it registers with the
binding which subclass to make once lollms_client's tools binding module is
loaded (``SandboxedBinding.promote_when``), and builds that subclass only when
asked.  So ``import lcp_sandbox`` and the command line never pay for lollms_client,
and the binding itself knows nothing of lollms.
"""
from __future__ import annotations

from ..binding.binding import SandboxedBinding

#: Once this module is loaded, a new SandboxedBinding is a LollmsToolBinding too.
LOLLMS_TOOLS_MODULE = "lollms_client.lollms_tools_binding"


def lollms_binding_class() -> type[SandboxedBinding]:
    """The ``LollmsToolBinding`` subclass of ``SandboxedBinding`` (imports lollms_client).

    lollms' loader gets this class for ``tools_binding_name="sandboxed"``.
    Raises ``ImportError`` when lollms_client is not installed."""
    from . import lollms_binding
    return lollms_binding.SandboxedBinding


SandboxedBinding.promote_when(LOLLMS_TOOLS_MODULE, lollms_binding_class)

__all__ = ["SandboxedBinding", "lollms_binding_class"]
