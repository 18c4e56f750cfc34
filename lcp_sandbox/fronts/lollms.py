"""``SandboxedBinding`` as a lollms_client ``LollmsToolBinding``.

The only module of lcp_sandbox that imports lollms_client.  Nothing imports it
at start-up: ``binding.lollms_binding_class()`` does, when lollms' loader asks
for the "sandboxed" tools binding (``lollms_bindings/sandboxed/__init__.py``),
or when a ``SandboxedBinding`` is created in a process that has already
imported lollms_client's tools binding module.  So importing lcp_sandbox, or
running its command line, never pays for importing lollms_client.
"""
from __future__ import annotations

from typing import Any

from lollms_client.lollms_tools_binding import LollmsToolBinding

from ..host import binding


class SandboxedBinding(binding.SandboxedBinding, LollmsToolBinding):
    """A ``SandboxedBinding`` that is also a ``LollmsToolBinding`` (so it has
    ``to_chat_tool_specs``, ``get_binding_config``...).  Same constructor."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        LollmsToolBinding.__init__(self, binding_name="sandboxed")
        binding.SandboxedBinding.__init__(self, *args, **kwargs)
