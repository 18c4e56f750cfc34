"""The binding floor: ``SandboxedBinding``, the LCP surface over a backend.

What tools exist (the catalog, from source with ``ast``), workspaces, what a call
lends the tool (host objects), the INIT a worker starts with.  It imports the
backends below it and knows nothing of the fronts above it (lollms, MCP, CLI)."""
