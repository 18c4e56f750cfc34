"""What tools a binding has: its discovery state and the LCP mounting helpers.

    tools_folders, tool_files, mounted libraries, code registered at run time
        └─► discover() ──► specs (discovered_tools), routes {tool: Route},
                           prompt providers {library: (Library, fn, file index)}
    mount_tool_library(name) ─► a library of the search dirs (the folders, then
                                lollms_client's default tools) joins and discovery runs again

Nothing here runs tool code (AST only, see core/); running is the binding's.
The binding hands its LCP mounting methods (``mount_tool_library``,
``is_tool_available``...) over to this object.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Protocol

from ..core import catalog, discovery
from ..core.schemas import ParsedFile

log = logging.getLogger("lcp_sandbox")


class ToolCatalog:
    def __init__(self, tools_folders: list[Path], tool_files: list[Path], host_tool_configs: dict,
                 load_flags: dict, default_tools: Callable[[], Optional[Path]],
                 on_discover: Callable[[], None]) -> None:
        self.tools_folders = tools_folders
        self.tool_files = tool_files
        self.host_tool_configs = host_tool_configs
        self.load_flags = load_flags
        self.session_flags: dict = {}
        # lollms_client's default tools folder, if any.
        self._default_tools = default_tools
        # What the binding derived from routes is stale.
        self._on_discover = on_discover
        # Parsed once per process, not per tenant.
        self.cache = discovery.SHARED
        self.mounted: list[discovery.Library] = []
        self.dynamic: dict[str, tuple[discovery.Library, ParsedFile]] = {}
        self.routes: dict[str, discovery.Route] = {}
        self.prompt_providers: dict[str, tuple[discovery.Library, str, int]] = {}
        self.specs: list[dict] = []

    def discover(self) -> None:
        found = discovery.discover(self.tools_folders, self.tool_files, cache=self.cache,
                                   host_tool_configs=self.host_tool_configs,
                                   session_flags=self.session_flags, load_flags=self.load_flags,
                                   dynamic=self.dynamic.values(), mounted=self.mounted)
        self.routes = found.routes
        self.prompt_providers = found.prompt_providers
        self.specs = found.specs
        self._on_discover()

    def library_keys(self, name: Optional[str] = None) -> set:
        """Every library this catalog may have started a worker for (named ``name``
        when given)."""
        libs = [r.library for r in self.routes.values()]
        libs += [lib for lib, _, _ in self.prompt_providers.values()]
        libs += [lib for lib, _ in self.dynamic.values()]
        return {lib.key for lib in libs if name is None or lib.name == name}

    def file_index(self, lib: discovery.Library, fn: str) -> int:
        """Which file of ``lib`` defines the function ``fn`` (the first one if none)."""
        return next((i for i, f in enumerate(lib.files)
                     if fn in getattr(self.cache.parse(Path(f)), "function_names", ())), 0)

    def function_names(self, lib: discovery.Library) -> set:
        """Every function name defined in ``lib``'s files (from source)."""
        return set().union(*(getattr(self.cache.parse(Path(f)), "function_names", frozenset())
                             for f in lib.files)) if lib.files else set()

    def add_tool_file(self, path: Path) -> int:
        """Add one tool file as a library of its own; how many tools it brought."""
        before = set(self.routes)
        if all(os.path.realpath(f) != os.path.realpath(path) for f in self.tool_files):
            self.tool_files.append(path)
        self.discover()
        return len(set(self.routes) - before)

    def forget(self, prefix: str) -> tuple[int, Optional[discovery.Library]]:
        """Drop the tools named ``tool_<prefix>...`` (or ``<prefix>``) and the library
        registered under ``prefix``: (how many tools, that library or None)."""
        def matches(name: str) -> bool:
            return name.startswith(f"tool_{prefix}") or name == prefix
        before = len(self.specs)
        self.specs = [t for t in self.specs if not matches(t.get("name", ""))]
        for name in [n for n in self.routes if matches(n)]:
            del self.routes[name]
        dyn = self.dynamic.pop(prefix, None)
        return before - len(self.specs), dyn[0] if dyn is not None else None

    # ------------------------------------------------------------ the LCP mounting helpers
    def search_dirs(self) -> list[Path]:
        dirs = [Path(d) for d in self.tools_folders]
        default = self._default_tools()
        if default is not None and default not in dirs:
            dirs.append(default)
        return dirs

    def set_session_flags(self, flags: Optional[dict]) -> None:
        self.session_flags = dict(flags) if isinstance(flags, dict) else {}
        self.discover()

    def find_library_for_tool(self, tool_name: str) -> Optional[str]:
        clean = (tool_name or "").strip()
        direct = catalog.find_library_dir(self.search_dirs(), clean)
        if direct is not None:
            return direct.name
        route = self.routes.get(clean)
        if route is not None:
            return route.library.name
        lib = catalog.library_for_tool(self.search_dirs(), clean, self.cache)
        if lib is not None and all(self._file_admitted(Path(f)) for f in lib.files[:1]):
            return lib.name
        return None

    def _file_admitted(self, path: Path) -> bool:
        parsed = self.cache.parse(path)
        return parsed is not None and discovery.file_permitted(
            parsed, path.stem, self.host_tool_configs, self.load_flags)

    def is_tool_available(self, tool_name: str) -> bool:
        clean = (tool_name or "").strip()
        return clean in self.routes or self.find_library_for_tool(clean) is not None

    def is_library_mounted(self, library_name: str) -> bool:
        lib = catalog.library_of(self.search_dirs(), library_name)
        if lib is None:
            return False
        expected = catalog.tools_of(lib, self.cache)
        return bool(expected) and expected <= self.routes.keys()

    def mount_tool_library(self, library_name: str) -> bool:
        resolved = (catalog.resolve_library_name(self.search_dirs(), library_name, self.cache)
                    or library_name)
        if not discovery.office_library_admitted(resolved, self.session_flags):
            log.warning("mount of %r refused: office-family library and its session flag is off",
                        library_name)
            return False
        lib = catalog.library_of(self.search_dirs(), resolved)
        if lib is None:
            log.warning("mount of %r: library not found in %s", library_name, self.search_dirs())
            return False
        if lib.files and not self._file_admitted(Path(lib.files[0])):
            log.warning("mount of %r refused: its TOOL_LIBRARY_LOAD_FLAG is not enabled",
                        library_name)
            return False
        if self.is_library_mounted(resolved):
            return True
        if not catalog.tools_of(lib, self.cache):
            log.warning("mount of %r: the library defines no tools", library_name)
            return False
        if all(m.key != lib.key for m in self.mounted):
            self.mounted.append(lib)
        self.discover()
        return any(r.library.key == lib.key for r in self.routes.values())

    def mount_tool_library_if_absent(self, library_name: str) -> bool:
        return self.is_library_mounted(library_name) or self.mount_tool_library(library_name)

    def load_tool_by_name(self, tool_name: str) -> Optional[dict]:
        clean = (tool_name or "").strip()
        spec = next((t for t in self.specs if t.get("name") == clean), None)
        if spec is not None:
            return spec
        lib = self.find_library_for_tool(clean) or catalog.resolve_library_name(
            self.search_dirs(), clean, self.cache)
        if lib and self.mount_tool_library(lib):
            return next((t for t in self.specs if t.get("name") == clean),
                        next((t for t in self.specs if t.get("_library") == lib), None))
        return None

    def libraries(self) -> Iterable[discovery.Library]:
        """The libraries that provide at least one discovered tool."""
        return {r.library.key: r.library for r in self.routes.values()}.values()


class _Binding(Protocol):
    """What a LibraryHandle uses of its SandboxedBinding."""
    catalog: ToolCatalog

    def call_library_function(self, lib: discovery.Library, fn: str, *args: Any,
                              **kwargs: Any) -> Any: ...


class LibraryHandle:
    """A mounted library as lollms hosts see it (``binding.mounted_libraries[name]``).

    ``hasattr`` answers from the source (AST); calling a function runs it in the
    library's worker, e.g. ``handle.init_tools_library({"autonomy_level": "strict"})``."""

    def __init__(self, binding: _Binding, library: discovery.Library) -> None:
        self._binding = binding
        self._library = library
        self.__name__ = library.name

    def __getattr__(self, name: str) -> Any:
        if name not in self._binding.catalog.function_names(self._library):
            raise AttributeError(f"library {self._library.name!r} has no function {name!r}")
        binding, library = self._binding, self._library

        def call(*args: Any, **kwargs: Any) -> Any:
            return binding.call_library_function(library, name, *args, **kwargs)
        return call

    def __repr__(self) -> str:
        return f"<sandboxed library {self._library.name} ({self._library.key})>"
