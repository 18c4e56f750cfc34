"""What LCPBinding users and lollms call on a binding besides running tools.

The mounting helpers (``mount_tool_library``, ``is_tool_available``...), the
attributes ``LCPBinding`` has (``discovered_tools``, ``tools_folders``...),
the private methods lollms_client calls, the handler setters, the dynamic
descriptions (``get_dynamic_tool_description``) and the ``cleanup`` command its
description.yaml declares.  Each one is a thin delegation: what tools exist is the
:class:`ToolCatalog`'s (``self.catalog``); running them is SandboxedBinding's
(binding/binding.py).

    get_dynamic_tool_description(tool_def)
        which library: the one whose file is tool_def["_python_file_path"], else the
                       one that provides tool_def["name"]; neither: None (nothing runs)
        the provider must be a function of that library's source, else None
        SandboxedBinding._prompt ─► the library's worker runs it ─► str, or None
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from ..backends.base import Backend
from ..core.discovery import Library
from .locations import as_paths
from .tool_catalog import LibraryHandle, ToolCatalog

PathLike = Union[str, Path]

log = logging.getLogger("lcp_sandbox")

#: A spec's library, and the index of the spec's own file in it (None: not known).
SpecLibrary = tuple[Library, Optional[int]]


class LcpSurface:
    """The LCPBinding surface of SandboxedBinding that is not execution."""
    catalog: ToolCatalog
    supervisor: Backend
    tenant: str
    # SandboxedBinding's, used here:
    discover_tools: Callable[..., list[dict]]
    call_library_function: Callable[..., Any]
    _prompt: Callable[[Library, str, int], Optional[str]]
    host_tool_configs: dict
    confirm_handler: Optional[Callable]
    user_interaction_handler: Optional[Callable]

    @property
    def discovered_tools(self) -> list[dict]:
        """The specs of the discovered tools (as ``LCPBinding``)."""
        return self.catalog.specs

    @discovered_tools.setter
    def discovered_tools(self, specs: list[dict]) -> None:
        self.catalog.specs = specs

    @property
    def tools_folders(self) -> list[Path]:
        """The folders libraries are discovered in."""
        return self.catalog.tools_folders

    @tools_folders.setter
    def tools_folders(self, folders: Any) -> None:
        self.catalog.tools_folders = as_paths(folders)

    @property
    def tool_files(self) -> list[Path]:
        """The loose tool files, each a library of its own."""
        return self.catalog.tool_files

    @tool_files.setter
    def tool_files(self, files: Any) -> None:
        self.catalog.tool_files = as_paths(files)

    @property
    def session_flags(self) -> dict:
        """The session feature flags (see ``set_session_flags``)."""
        return self.catalog.session_flags

    def list_tools(self, **kwargs: Any) -> list[dict]:
        """Same as ``discover_tools`` (as ``LCPBinding``)."""
        return self.discover_tools(**kwargs)

    @property
    def tools_folder_path(self) -> Optional[Path]:
        """The first of ``tools_folders`` (as ``LCPBinding``)."""
        return self.tools_folders[0] if self.tools_folders else None

    def set_session_flags(self, flags: Optional[dict]) -> None:
        """Session feature flags (office-family gating); discovery runs again."""
        self.catalog.set_session_flags(flags)

    def find_library_for_tool(self, tool_name: str) -> Optional[str]:
        """Which library provides ``tool_name`` (or is called that)."""
        return self.catalog.find_library_for_tool(tool_name)

    def is_tool_available(self, tool_name: str) -> bool:
        """Whether ``tool_name`` is discovered, or a library of the search folders
        (``tools_folders`` and lollms_client's default tools) provides it."""
        return self.catalog.is_tool_available(tool_name)

    def is_library_mounted(self, library_name: str) -> bool:
        """Whether every tool of the library ``library_name`` is discovered."""
        return self.catalog.is_library_mounted(library_name)

    def mount_tool_library(self, library_name: str) -> bool:
        """Make a library of the search dirs available by name (lazy: nothing runs)."""
        return self.catalog.mount_tool_library(library_name)

    def mount_tool_library_if_absent(self, library_name: str) -> bool:
        """``mount_tool_library`` unless the library is already mounted."""
        return self.catalog.mount_tool_library_if_absent(library_name)

    def load_tool_by_name(self, tool_name: str) -> Optional[dict]:
        """The spec of ``tool_name``, mounting its library first if needed."""
        return self.catalog.load_tool_by_name(tool_name)

    @property
    def mounted_libraries(self) -> dict[str, "LibraryHandle"]:
        """Library name -> handle; module functions called on a handle run in the worker."""
        return {lib.name: LibraryHandle(self, lib) for lib in self.catalog.libraries()}

    def list_models(self) -> list:
        """No models: this is a tools binding (as ``LCPBinding``)."""
        return []

    def _discover_local_tools(self) -> None:
        """lollms_client calls this private LCPBinding method (personalities)."""
        self.catalog.discover()

    def _load_tool_file(self, py_file: PathLike) -> int:
        """Add one tool file (a library of its own); returns how many tools it brought.

        lollms_client calls this private LCPBinding method (``chat(tools=[file])``)."""
        path = Path(py_file)
        if not path.is_file() or path.suffix != ".py":
            return 0
        return self.catalog.add_tool_file(path)

    def set_confirm_handler(self, handler: Optional[Callable]) -> None:
        """Set the confirm handler (also in every ``host_tool_configs`` entry, as
        ``LCPBinding``); running workers use it from their next call."""
        self.confirm_handler = handler
        for cfg in self.host_tool_configs.values():
            if isinstance(cfg, dict):
                cfg["confirm_handler"] = handler

    def set_user_interaction_handler(self, handler: Optional[Callable]) -> None:
        """Set the user interaction handler, as ``set_confirm_handler``."""
        self.user_interaction_handler = handler
        for cfg in self.host_tool_configs.values():
            if isinstance(cfg, dict):
                cfg["user_interaction_handler"] = handler

    def library_context(self, library: str) -> Optional[str]:
        """The dynamic context of a library (its ``tool_<library>_prompt``), run in its worker."""
        entry = self.catalog.prompt_providers.get(library)
        return self._prompt(*entry) if entry else None

    def unregister_tools_by_prefix(self, tool_name_prefix: str) -> int:
        """Forget the tools named ``tool_<prefix>...`` (or ``<prefix>``) and stop the
        worker of the library registered under that prefix; returns how many
        tools were removed."""
        removed, lib = self.catalog.forget(tool_name_prefix)
        if lib is not None:
            self.supervisor.stop(self.tenant, lib.key)
        return removed

    # ------------------------------------------------------------ dynamic descriptions
    def get_dynamic_tool_description(self, tool_def: Mapping[str, Any]) -> Optional[str]:
        """The description a tool's ``tool_<name>_prompt`` provider writes now, run in the
        library's worker (as ``LCPBinding``, which runs it in the host); ``None`` when the
        spec has no dynamic prompt, names no library of this binding or no function of
        it, or the provider fails.

        ``tool_def`` is a spec of ``discover_tools`` (or one of ``LCPBinding``'s: its
        ``_python_file_path`` picks the library when that file is one of this binding's).
        A spec naming a file that is not one of this binding's libraries runs nothing."""
        fn = tool_def.get("_dynamic_prompt_fn_name")
        if not tool_def.get("_has_dynamic_prompt") or not isinstance(fn, str) or not fn:
            return None
        found = self._library_of_spec(tool_def)
        if found is None:
            log.warning("get_dynamic_tool_description(%r): no library of this binding provides "
                        "it (file %r); nothing run", tool_def.get("name"),
                        tool_def.get("_python_file_path"))
            return None
        lib, index = found
        if fn not in self._function_names(lib):
            return None
        text = self._prompt(lib, fn, self.catalog.file_index(lib, fn) if index is None else index)
        return text if isinstance(text, str) else None

    def _library_of_spec(self, tool_def: Mapping[str, Any]) -> Optional[SpecLibrary]:
        """(library, index of the spec's file in it, or None) of a tool spec: by its file
        when it names one, else by the tool's name."""
        path = tool_def.get("_python_file_path")
        if isinstance(path, (str, Path)) and str(path):
            real = os.path.realpath(path)
            for lib in self.catalog.libraries():
                for index, f in enumerate(lib.files):
                    if os.path.realpath(f) == real:
                        return lib, index
            return None
        route = self.catalog.routes.get(str(tool_def.get("name", "")))
        return (route.library, None) if route is not None else None

    def _function_names(self, lib: Library) -> set:
        """The functions ``lib``'s source defines (files, or code registered at run time)."""
        if lib.files:
            return self.catalog.function_names(lib)
        return {n for dyn, parsed in self.catalog.dynamic.values() if dyn.key == lib.key
                for n in parsed.function_names}

    # ------------------------------------------------------------ lollms command
    def cleanup(self, status: str = "") -> dict:
        """Remove the tools generated at run time: forget every library registered with
        ``register_tool_from_code`` and stop its worker; file tools stay.

        Returns ``{"status": True, "message", "removed_tools"}``: ``message`` is
        ``status`` when given, else what was removed."""
        dynamic = dict(self.catalog.dynamic)
        keys = {lib.key for lib, _ in dynamic.values()}
        removed = sorted(n for n, r in self.catalog.routes.items() if r.library.key in keys)
        self.catalog.dynamic.clear()
        self.catalog.discover()
        for lib, _ in dynamic.values():
            self.supervisor.stop(self.tenant, lib.key)
        summary = (f"removed {len(removed)} tool(s) registered from code "
                   f"(prefixes: {', '.join(sorted(dynamic))})" if dynamic
                   else "no tool registered from code: nothing removed")
        return {"status": True, "message": status or summary, "removed_tools": removed}
