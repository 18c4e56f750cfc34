"""lollms_client tools binding "sandboxed": LCP tools run in isolated worker processes.

    LollmsClient(tools_binding_name="sandboxed",
                 tools_bindings_dir=lcp_sandbox.lollms_bindings_dir(),
                 tools_binding_config={"tools_folders": [...], ...})

lollms loads this file when it is asked for the binding; only then is the
``LollmsToolBinding`` subclass of ``lcp_sandbox.SandboxedBinding`` made.
"""
from lcp_sandbox.fronts.lollms import lollms_binding_class

SandboxedBinding = lollms_binding_class()
BindingName = "SandboxedBinding"
