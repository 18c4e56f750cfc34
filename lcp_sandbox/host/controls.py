"""What a host that fronts users (an MCP server, a chat UI) does to running libraries:
cancel one call, reload one library.  Thin calls into the backend."""
from __future__ import annotations

from typing import Any

from .tool_catalog import ToolCatalog


class BindingControls:
    """Mixed into SandboxedBinding."""
    catalog: ToolCatalog
    supervisor: Any                    # the Backend
    tenant: str
    _closed: bool

    def interrupt(self, thread_id: int) -> bool:
        """Interrupt the call of this binding that the host thread ``thread_id``
        (``threading.get_ident()`` of the thread in ``execute_tool``) is waiting for,
        as its soft timeout would: ``ToolTimeout`` is raised inside the tool (a tool
        waiting for the host, e.g. for a confirmation, is interrupted once it has its
        answer), its worker and module state are kept, and that ``execute_tool``
        returns a failure with status 499.  For hosts whose user cancelled a call.
        Returns whether a running call was signalled: False when that thread runs no
        call of this binding, or its call still waits for its worker."""
        if self._closed:
            return False
        return self.supervisor.interrupt(self.tenant, thread_id)

    def restart_library(self, library_name: str) -> bool:
        """Stop the worker(s) of the library ``library_name`` (this binding's tenant), so
        that its next call starts a fresh worker that imports the library's files again:
        for a library whose code changed on disk (module state is lost, and
        ``init_tools_library`` runs again).  Call ``discover_tools(force_refresh=True)``
        too when its tools may have changed.  Returns whether the library is known
        (whether or not a worker was running)."""
        keys = self.catalog.library_keys(library_name)
        for key in keys:
            self.supervisor.stop(self.tenant, key)
        return bool(keys)
