"""The ``LollmsToolBinding`` subclass of ``SandboxedBinding``: the only module of
lcp_sandbox that imports lollms_client (fronts/lollms.py imports it on demand)."""
from __future__ import annotations

from typing import Any

from lollms_client.lollms_tools_binding import LollmsToolBinding

from ..binding import binding


class SandboxedBinding(binding.SandboxedBinding, LollmsToolBinding):
    """A ``SandboxedBinding`` that is also a ``LollmsToolBinding`` (so it has
    ``to_chat_tool_specs``, ``get_binding_config``...).  Same constructor."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        LollmsToolBinding.__init__(self, binding_name="sandboxed")
        binding.SandboxedBinding.__init__(self, *args, **kwargs)
