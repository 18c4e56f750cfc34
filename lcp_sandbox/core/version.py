"""The engine's version (one place: the package, the MCP server's name, the build)."""
__version__ = "0.1.0"
