"""Where a tenant's calls run: a workspace resolved in the host, inside the
tenant's root (403 otherwise), created when missing (as ``mkdir -p``)."""
from __future__ import annotations

import os
from typing import Optional

from ..core import normalize
from ..core.policy import path_within


class Workspaces:
    def __init__(self, tenant: str, root: Optional[str]) -> None:
        self.tenant = tenant
        # The tenant's workspace root (resolved), or None.
        self.root = root
        # Workspaces known to exist (made if missing)
        self._existing: set[str] = set()

    def check(self, library: str, tool: str, cwd: str) -> Optional[dict]:
        """None when a call may run in the resolved workspace ``cwd``, else its
        failure result: 403 outside the tenant's ``workspace_root``; 500 when it
        does not exist and cannot be created (it is created, as ``mkdir -p``, only
        after the root check).  A workspace seen to exist is not checked again:
        the worker still enters it on every call."""
        if self.root is not None and not path_within(cwd, self.root):
            return normalize.failure(
                f"[{library}] tool '{tool}' not run: the workspace {cwd!r} is outside the "
                f"root {self.root!r} of tenant {self.tenant!r}.", normalize.FORBIDDEN)
        if cwd in self._existing:
            return None
        try:
            # One stat; makedirs makes three calls.
            if not os.path.isdir(cwd):
                os.makedirs(cwd, exist_ok=True)
        except OSError as exc:
            return normalize.failure(f"[{library}] tool '{tool}' not run: the workspace {cwd!r} "
                                     f"does not exist and cannot be created "
                                     f"({exc.strerror or exc}).")
        if len(self._existing) >= 4096:
            self._existing.clear()
        self._existing.add(cwd)
        return None
