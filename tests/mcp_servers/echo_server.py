"""A small MCP server for the mcp_bridge tests, written with the official SDK (2.x).

``python echo_server.py`` speaks MCP over stdin/stdout until stdin closes;
``python echo_server.py --http PORT`` serves streamable HTTP on
``http://127.0.0.1:PORT/mcp`` instead.

Tools: ``add``, ``echo``, ``fail`` (raises ``ToolError``, so its message reaches
the client), ``info`` (this process's pid, parent pid, working directory and one
environment variable, so tests can see where and how the server was started),
``sleep`` (async, so a cancelled call stops at once) and ``pixel`` (an image).
"""
import base64
import os
import sys

import anyio
from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("echo")

# A 1x1 transparent PNG.
PIXEL_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Returns the text unchanged."""
    return text


@server.tool()
def fail(message: str = "this tool always fails") -> str:
    """Always fails, with the given message."""
    raise ToolError(message)


@server.tool()
def info(env_var: str = "") -> dict:
    """Where this server runs: pid, parent pid, working directory, and an environment variable."""
    return {"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
            "env": os.environ.get(env_var) if env_var else None}


@server.tool()
async def sleep(seconds: float) -> str:
    """Waits for the given number of seconds."""
    await anyio.sleep(seconds)
    return f"slept {seconds}s"


@server.tool()
def pixel() -> Image:
    """Returns a 1x1 PNG image."""
    return Image(data=PIXEL_PNG, format="png")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
