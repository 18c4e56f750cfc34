"""Per-library environments: declared beside the library, built ahead by uv, wheels only.

    store.py     the folder of environments: content-addressed, complete or not at all
    build.py     one environment made by uv (resolve, lock, install), without the host's secrets
    manager.py   Environments: found or built for a worker that starts, waited for in bounds

The declaration is read by core/requirements.py; a worker puts its environment first
on its path (worker/environment.py)."""
from .manager import Environments
from .store import Built, Store

__all__ = ["Built", "Environments", "Store"]
