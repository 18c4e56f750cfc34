"""Opens a pipe at import: through a shared template it would connect tenants."""
import os

R, W = os.pipe()
os.set_blocking(R, False)


def tool_send(data: str) -> dict:
    """Writes to the import-time pipe."""
    os.write(W, data.encode())
    return {"success": True, "output": "sent"}


def tool_receive() -> dict:
    """Reads what is in the import-time pipe."""
    try:
        return {"success": True, "output": os.read(R, 100).decode()}
    except BlockingIOError:
        return {"success": True, "output": "<nothing>"}
