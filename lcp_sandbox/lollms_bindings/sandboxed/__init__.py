"""lollms_client tools binding "sandboxed": LCP tools run in isolated worker processes.

    LollmsClient(tools_binding_name="sandboxed",
                 tools_bindings_dir=lcp_sandbox.lollms_bindings_dir(),
                 tools_binding_config={"tools_folders": [...], ...})
"""
from lcp_sandbox.binding import SandboxedBinding

BindingName = "SandboxedBinding"
