"""Starts a thread at import."""
import threading

_stop = threading.Event()
threading.Thread(target=_stop.wait, daemon=True).start()


def tool_threads() -> dict:
    """How many threads run here."""
    return {"success": True, "output": threading.active_count()}
