"""Writes to stdout every way a tool can (none of it may reach the MCP client's stdout)."""
import os
import subprocess
import sys

TOOL_LIBRARY_NAME = "Noisy"
print("NOISY-IMPORT-TIME")


def tool_noisy() -> dict:
    """Prints to stdout from Python, from the file descriptor and from a child process."""
    print("NOISY-PRINT")
    sys.stdout.flush()
    os.write(1, b"NOISY-FD1\n")
    subprocess.run([sys.executable, "-c", "print('NOISY-CHILD')"], check=True)
    print("NOISY-STDERR", file=sys.stderr)
    return {"success": True, "output": "printed"}
