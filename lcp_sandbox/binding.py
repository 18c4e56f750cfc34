"""SandboxedBinding: the LCPBinding surface, with every library in a worker.

The host side of a call is deliberately thin:

    execute_tool(name, params)
        route = routes[name]                      404 if absent
        params = literal defaults | params        (no copy of the caller's dict kept;
                                                   not a mapping or None: TypeError)
        503 if the binding is closed
        cwd = realpath(workspace=) | binding workspace | os.getcwd()
                                                  resolved here, against the host's CWD;
                                                  403 outside workspace_root, else mkdir -p
        host objects the tool may use ─► HostObjects (lent as proxies)
        Supervisor.run(tenant, library, CALL...) ─► result dict

Everything about discovery is in discovery.py, result shapes in
normalize.py, processes in supervisor.py.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib.util
import inspect
import logging
import os
import pickle
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from . import catalog, discovery, normalize
from . import protocol as P
from .limits import Limits
from .proxies import HostObjects, is_plain
from .supervisor import SandboxEvent, Supervisor
from .protocol import HANDLER_CONFIRM, HANDLER_UI, HOST_PARAMS, Ref
from .confine import allowed_environment

log = logging.getLogger("lcp_sandbox")

PathLike = Union[str, Path]


def lollms_binding_class() -> type:
    """The ``LollmsToolBinding`` subclass of ``SandboxedBinding`` (imports lollms_client).

    lollms' loader gets this class for ``tools_binding_name="sandboxed"``.
    Raises ``ImportError`` when lollms_client is not installed."""
    from .lollms_binding import SandboxedBinding as LollmsSandboxedBinding
    return LollmsSandboxedBinding


#: Once this module is loaded, a new SandboxedBinding is a LollmsToolBinding too.
_LOLLMS_TOOLS_MODULE = "lollms_client.lollms_tools_binding"


def lollms_bindings_dir() -> Path:
    """Pass as ``LollmsClient(tools_bindings_dir=...)`` with ``tools_binding_name="sandboxed"``."""
    return Path(__file__).resolve().parent / "lollms_bindings"


def bundled_tools_dir() -> Path:
    """The example libraries shipped with lcp_sandbox."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "bundled_tools", here.parent / "tools"):
        if candidate.is_dir():
            return candidate
    return here.parent / "tools"


def lollms_default_tools_dir() -> Optional[Path]:
    """lollms_client's own default_tools folder, found without importing lollms_client."""
    try:
        spec = importlib.util.find_spec("lollms_client")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "tools_bindings" / "lcp" / "default_tools"
    return d if d.is_dir() else None


def _paths(value: Any) -> list[Path]:
    if not value:
        return []
    if isinstance(value, (str, Path)):
        return [Path(value)]
    return [Path(v) for v in value]


class SandboxedBinding:
    """Drop-in for lollms_client's ``LCPBinding`` that runs each tool library in a
    long-lived worker process of its own (module state survives between calls).

    Constructor keywords (all optional; the first may be given by position):

    host_tool_configs
        ``{library stem: dict}``, as ``LCPBinding``: passed to the library's
        ``init_tools_library`` and to tools that read their host config.  Its
        ``"sandbox"`` entry sets that library's limits: ``timeout_s``,
        ``memory_mb``, ``cpu_s``, ``max_open_files``, ``max_file_size_mb``,
        ``max_result_mb``, ``grace_s``, ``log_bytes_per_s``, ``confine``,
        ``network``, ``env``, ``read_paths``.
    tools_folders
        A folder or a list of folders to discover libraries in (each ``X/``
        sub-folder is a library, and so is each loose ``.py`` file);
        ``tools_folder_path=`` is accepted too.  Default when neither this nor
        ``tool_files`` is given: lollms_client's default tools if installed,
        else the tools bundled with lcp_sandbox.
    tool_files
        A ``.py`` file or a list of them, each loaded as a library of its own.
    confirm_handler
        ``handler(source, script_label, argv=None) -> (decision, reason)``, run in
        the host when a tool asks for confirmation.
    user_interaction_handler
        Run in the host when a tool asks the user something.
    workspace
        The tools' working directory (the worker's CWD during a call), resolved
        against the host's CWD when the binding is made.  Default: the host's CWD
        at each call.  A workspace that does not exist is created by the first
        call that uses it.
    tenant
        Who the calls are for (default ``"default"``).  Workers are keyed by
        (tenant, library): tenants never share a worker or its module state.
    timeout_s
        Timeout of a call in seconds (default 60; ``None`` or 0: none).
        ``host_tool_configs[stem]["sandbox"]["timeout_s"]`` and
        ``execute_tool(..., timeout_s=)`` override it.
    memory_mb
        Memory limit of each worker (``RLIMIT_DATA``, and a watchdog over the RSS
        of its process tree).  Default: none.
    supervisor
        A ``Supervisor`` shared with other bindings.  Default: one of the
        binding's own, closed by ``close()``.
    confine
        Confine the workers (clean environment, Landlock, see the README).
        Default: the supervisor's ``confine``.
    workspace_root
        A call whose workspace is not inside this folder is refused with 403;
        confined workers are confined to it.
    other keywords
        Load flags, as ``LCPBinding``: a library declaring
        ``TOOL_LIBRARY_LOAD_FLAG = "X"`` loads only when ``X=True`` is given here
        or in its ``host_tool_configs`` entry.

    Use it as a context manager, or call ``close()``.  When lollms_client's tools
    binding module is already imported, the new binding is an instance of
    ``lollms_binding_class()``, a ``LollmsToolBinding`` subclass of this class;
    lcp_sandbox itself never imports lollms_client.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "SandboxedBinding":
        if cls is SandboxedBinding and _LOLLMS_TOOLS_MODULE in sys.modules:
            cls = lollms_binding_class()
        return super().__new__(cls)

    def __init__(self, host_tool_configs: Optional[dict] = None, *, tools_folders: Any = None,
                 tool_files: Any = None, confirm_handler: Optional[Callable] = None,
                 user_interaction_handler: Optional[Callable] = None,
                 workspace: Optional[PathLike] = None, tenant: str = "default",
                 timeout_s: Optional[float] = 60.0, memory_mb: Optional[float] = None,
                 supervisor: Optional[Supervisor] = None, confine: Optional[bool] = None,
                 workspace_root: Optional[PathLike] = None, **kwargs: Any) -> None:
        self.binding_name = "sandboxed"
        self.host_tool_configs: dict = host_tool_configs if host_tool_configs is not None else {}
        self.confirm_handler = confirm_handler
        self.user_interaction_handler = user_interaction_handler
        self.tool_files = _paths(tool_files)
        self.tools_folders = _paths(tools_folders or kwargs.get("tools_folder_path"))
        if not self.tools_folders and not self.tool_files:
            self.tools_folders = [lollms_default_tools_dir() or bundled_tools_dir()]
        self.workspace = os.path.realpath(workspace) if workspace else None
        self.tenant = tenant
        self.workspace_root = os.path.realpath(workspace_root) if workspace_root else None
        self._own_supervisor = supervisor is None
        self.supervisor = supervisor or Supervisor()
        self.limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb,
                             confine=self.supervisor.confine if confine is None else bool(confine))
        self._load_flags = kwargs
        self.session_flags: dict = {}
        self._mounted: list[discovery.Library] = []
        self._cache = discovery.FileCache()
        self._dynamic: dict[str, tuple[discovery.Library, discovery.ParsedFile]] = {}
        self._routes: dict[str, discovery.Route] = {}
        self._lib_limits: dict[str, Limits] = {}
        self._prompt_providers: dict[str, tuple] = {}
        self._resolvers: dict[str, Callable[[Any], Any]] = {}
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._existing: set[str] = set()          # workspaces known to exist (made if missing)
        self._closed = False
        self.discovered_tools: list[dict] = []
        self._discover()

    # ------------------------------------------------------------ discovery

    def _discover(self) -> None:
        found = discovery.discover(self.tools_folders, self.tool_files, cache=self._cache,
                                   host_tool_configs=self.host_tool_configs,
                                   session_flags=self.session_flags, load_flags=self._load_flags,
                                   dynamic=self._dynamic.values(), mounted=self._mounted)
        self._routes = found.routes
        self._prompt_providers = found.prompt_providers
        self._lib_limits.clear()
        self.discovered_tools = found.specs

    def discover_tools(self, specific_tool_names: Optional[list] = None, **kwargs: Any) -> list[dict]:
        """The LCP specs of the tools (``name``, ``description``, ``input_schema``, and
        private ``_`` keys), built from source with ``ast``: no tool code runs here.

        ``specific_tool_names`` keeps only those; ``force_refresh=True`` scans the
        folders again (unchanged files are not parsed again).  A tool whose
        description comes from a ``tool_<name>_prompt`` function gets it from a
        run of that function in the library's worker."""
        if kwargs.get("force_refresh", False) or not self.discovered_tools:
            self._discover()
        tools = self.discovered_tools
        if specific_tool_names:
            tools = [t for t in tools if t.get("name") in specific_tool_names]
        for spec in tools:
            route = self._routes.get(spec["name"])
            if spec.get("_has_dynamic_prompt") and route is not None:
                text = self._prompt(route.library, spec["_dynamic_prompt_fn_name"],
                                    spec["_dynamic_prompt_file_index"])
                if text:
                    spec["description"] = text
        return tools

    def list_tools(self, **kwargs: Any) -> list[dict]:
        """Same as ``discover_tools`` (as ``LCPBinding``)."""
        return self.discover_tools(**kwargs)

    def library_context(self, library: str) -> Optional[str]:
        """The dynamic context of a library (its ``tool_<library>_prompt``), run in its worker."""
        entry = self._prompt_providers.get(library)
        return self._prompt(*entry) if entry else None

    def _prompt(self, lib: discovery.Library, fn: str, index: int) -> Optional[str]:
        if self._closed:
            return None
        cwd = self.workspace or os.getcwd()
        refused = self._check_workspace(lib, fn, cwd)
        if refused is not None:
            log.warning("%s", refused["error"])
            return None
        root = self._root(lib, cwd)
        msg = P.Prompt(fn, index, cwd, self._handlers_mask())
        try:
            return self.supervisor.run(self.tenant, lib, msg, init=lambda: self._init(lib, root),
                                       limits=self._limits(lib), objects=HostObjects(self._named_for(lib)),
                                       tool=fn, root=root)
        except SandboxEvent as ev:
            log.warning("prompt provider %s of %s failed: %s", fn, lib.name, ev)
            return None

    # ------------------------------------------------------------ mounting (LCPBinding helpers)

    @property
    def tools_folder_path(self) -> Optional[Path]:
        """The first of ``tools_folders`` (as ``LCPBinding``)."""
        return self.tools_folders[0] if self.tools_folders else None

    def _search_dirs(self) -> list[Path]:
        dirs = [Path(d) for d in self.tools_folders]
        default = lollms_default_tools_dir()
        if default is not None and default not in dirs:
            dirs.append(default)
        return dirs

    def set_session_flags(self, flags: Optional[dict]) -> None:
        """Session feature flags (office-family gating); discovery runs again."""
        self.session_flags = dict(flags) if isinstance(flags, dict) else {}
        self._discover()

    def find_library_for_tool(self, tool_name: str) -> Optional[str]:
        """Which library provides ``tool_name`` (or is called that)."""
        clean = (tool_name or "").strip()
        direct = catalog.find_library_dir(self._search_dirs(), clean)
        if direct is not None:
            return direct.name
        route = self._routes.get(clean)
        if route is not None:
            return route.library.name
        lib = catalog.library_for_tool(self._search_dirs(), clean, self._cache)
        if lib is not None and all(self._file_admitted(Path(f)) for f in lib.files[:1]):
            return lib.name
        return None

    def _file_admitted(self, path: Path) -> bool:
        parsed = self._cache.parse(path)
        return parsed is not None and discovery.file_permitted(
            parsed, path.stem, self.host_tool_configs, self._load_flags)

    def is_tool_available(self, tool_name: str) -> bool:
        """Whether ``tool_name`` is discovered, or a library of the search folders
        (``tools_folders`` and lollms_client's default tools) provides it."""
        clean = (tool_name or "").strip()
        return clean in self._routes or self.find_library_for_tool(clean) is not None

    def is_library_mounted(self, library_name: str) -> bool:
        """Whether every tool of the library ``library_name`` is discovered."""
        lib = catalog.library_of(self._search_dirs(), library_name)
        if lib is None:
            return False
        expected = catalog.tools_of(lib, self._cache)
        return bool(expected) and expected <= self._routes.keys()

    def mount_tool_library(self, library_name: str) -> bool:
        """Make a library of the search dirs available by name (lazy: nothing runs)."""
        resolved = catalog.resolve_library_name(self._search_dirs(), library_name, self._cache) or library_name
        if not discovery.office_library_admitted(resolved, self.session_flags):
            log.warning("mount of %r refused: office-family library and its session flag is off", library_name)
            return False
        lib = catalog.library_of(self._search_dirs(), resolved)
        if lib is None:
            log.warning("mount of %r: library not found in %s", library_name, self._search_dirs())
            return False
        if lib.files and not self._file_admitted(Path(lib.files[0])):
            log.warning("mount of %r refused: its TOOL_LIBRARY_LOAD_FLAG is not enabled", library_name)
            return False
        if self.is_library_mounted(resolved):
            return True
        if not catalog.tools_of(lib, self._cache):
            log.warning("mount of %r: the library defines no tools", library_name)
            return False
        if all(m.key != lib.key for m in self._mounted):
            self._mounted.append(lib)
        self._discover()
        return any(r.library.key == lib.key for r in self._routes.values())

    def mount_tool_library_if_absent(self, library_name: str) -> bool:
        """``mount_tool_library`` unless the library is already mounted."""
        return self.is_library_mounted(library_name) or self.mount_tool_library(library_name)

    def load_tool_by_name(self, tool_name: str) -> Optional[dict]:
        """The spec of ``tool_name``, mounting its library first if needed."""
        clean = (tool_name or "").strip()
        spec = next((t for t in self.discovered_tools if t.get("name") == clean), None)
        if spec is not None:
            return spec
        lib = self.find_library_for_tool(clean) or catalog.resolve_library_name(
            self._search_dirs(), clean, self._cache)
        if lib and self.mount_tool_library(lib):
            return next((t for t in self.discovered_tools if t.get("name") == clean),
                        next((t for t in self.discovered_tools if t.get("_library") == lib), None))
        return None

    @property
    def mounted_libraries(self) -> dict[str, "LibraryHandle"]:
        """Library name -> handle; module functions called on a handle run in the worker."""
        libs = {r.library.key: r.library for r in self._routes.values()}
        return {lib.name: LibraryHandle(self, lib) for lib in libs.values()}

    def call_library_function(self, lib: discovery.Library, fn: str, *args: Any, **kwargs: Any) -> Any:
        """Run a module-level function of a library in its worker; returns its value.

        Raises ``RuntimeError`` with the sandbox's explanation when the call fails
        in the sandbox (closed binding, crash, timeout...)."""
        if self._closed:
            raise RuntimeError(self._closed_text(fn))
        index = next((i for i, f in enumerate(lib.files)
                      if fn in getattr(self._cache.parse(Path(f)), "function_names", ())), 0)
        objects = HostObjects(self._named_for(lib))
        cwd = self.workspace or os.getcwd()
        refused = self._check_workspace(lib, fn, cwd)
        if refused is not None:
            raise RuntimeError(refused["error"])
        root = self._root(lib, cwd)
        msg = P.ModCall(fn, index, tuple(objects.lend(a) for a in args),
                        {k: objects.lend(v) for k, v in kwargs.items()}, cwd, self._handlers_mask())
        try:
            return self.supervisor.run(self.tenant, lib, msg, init=lambda: self._init(lib, root),
                                       limits=self._limits(lib), objects=objects, tool=fn, root=root)
        except SandboxEvent as ev:
            raise RuntimeError(ev.result["error"]) from None

    def list_models(self) -> list:
        """No models: this is a tools binding (as ``LCPBinding``)."""
        return []

    def _discover_local_tools(self) -> None:
        """lollms_client calls this private LCPBinding method (personalities)."""
        self._discover()

    def _load_tool_file(self, py_file: PathLike) -> int:
        """Add one tool file (a library of its own); returns how many tools it brought.

        lollms_client calls this private LCPBinding method (``chat(tools=[file])``)."""
        path = Path(py_file)
        if not path.is_file() or path.suffix != ".py":
            return 0
        before = set(self._routes)
        if all(os.path.realpath(f) != os.path.realpath(path) for f in self.tool_files):
            self.tool_files.append(path)
        self._discover()
        return len(set(self._routes) - before)

    # ------------------------------------------------------------ execution

    def _handlers_mask(self) -> int:
        return (HANDLER_CONFIRM if self.confirm_handler is not None else 0) | \
               (HANDLER_UI if self.user_interaction_handler is not None else 0)

    def _named_for(self, lib: discovery.Library) -> Callable[[Any], Any]:
        """What a worker of ``lib`` may name: the handlers (None when not set) and
        the values of its own stems' host_tool_configs, nothing else."""
        resolver = self._resolvers.get(lib.key)
        if resolver is not None:
            return resolver
        stems = frozenset(Path(f).stem for f in lib.files) or frozenset({lib.name})

        def resolve(ref: Any) -> Any:
            if ref == P.REF_CONFIRM:
                return self.confirm_handler
            if ref == P.REF_UI:
                return self.user_interaction_handler
            if type(ref) is list and len(ref) == 3 and ref[0] == "cfg" and ref[1] in stems:
                value = (self.host_tool_configs.get(ref[1]) or {}).get(ref[2])
                if ref[2] == "confirm_handler" and value is None:
                    return self.confirm_handler
                if ref[2] == "user_interaction_handler" and value is None:
                    return self.user_interaction_handler
                if value is not None and not _sendable(value):
                    return value
            raise PermissionError(f"{ref!r} is not a host object lent to library {lib.name!r}")
        self._resolvers[lib.key] = resolve
        return resolve

    def _limits(self, lib: discovery.Library) -> Limits:
        lim = self._lib_limits.get(lib.key)
        if lim is None:
            cfg = self.host_tool_configs.get(lib.name) or {}
            lim = self._lib_limits[lib.key] = Limits.merged(self.limits, cfg.get("sandbox"))
        return lim

    def _root(self, lib: discovery.Library, cwd: str) -> str:
        """The confinement root of a call ("" when the library is not confined).

        Landlock rules cannot be widened, so a confined worker serves one root for
        life: the tenant's workspace root, or else the one workspace it was started
        for (the slot key includes it, so another workspace gets another worker)."""
        if not self._limits(lib).confine:
            return ""
        return self.workspace_root or os.path.realpath(cwd)

    def _init(self, lib: discovery.Library, root: str = "") -> dict:
        stems = [Path(f).stem for f in lib.files] or [lib.name]
        configs = {}
        for stem in stems:
            cfg = self.host_tool_configs.get(stem)
            if isinstance(cfg, dict):
                configs[stem] = {k: v if _sendable(v) else Ref(["cfg", stem, k]) for k, v in cfg.items()}
        lim = self._limits(lib)
        confine = None
        env = dict(os.environ)
        if root:
            confine = {"root": root, "read_paths": [str(p) for p in (lib.root, *lim.read_paths) if p]}
            env = allowed_environment(env)        # a confined worker never receives the rest
        return P.Init(lib.name, [str(f) for f in lib.files], lib.source, configs, self._handlers_mask(),
                      list(sys.path), env, confine, None,
                      [x.strip() for x in os.environ.get("LCP_SANDBOX_DISABLE", "").split(",") if x.strip()],
                      {k: getattr(lim, k) for k in lim.__dataclass_fields__})

    def _closed_text(self, tool: str) -> str:
        return f"tool '{tool}' not run: this SandboxedBinding (tenant {self.tenant!r}) is closed."

    def _check_workspace(self, lib: discovery.Library, tool: str, cwd: str) -> Optional[dict]:
        """None when a call may run in the resolved workspace ``cwd``, else its
        failure result: 403 outside the tenant's ``workspace_root``; 500 when it
        does not exist and cannot be created (it is created, as ``mkdir -p``, only
        after the root check).  A workspace seen to exist is not checked again:
        the worker still enters it on every call."""
        if self.workspace_root is not None and not _inside(cwd, self.workspace_root):
            return normalize.failure(
                f"[{lib.name}] tool '{tool}' not run: the workspace {cwd!r} is outside the "
                f"root {self.workspace_root!r} of tenant {self.tenant!r}.", normalize.FORBIDDEN)
        if cwd in self._existing:
            return None
        try:
            os.makedirs(cwd, exist_ok=True)
        except OSError as exc:
            return normalize.failure(f"[{lib.name}] tool '{tool}' not run: the workspace {cwd!r} does not "
                                     f"exist and cannot be created ({exc.strerror or exc}).")
        if len(self._existing) >= 4096:
            self._existing.clear()
        self._existing.add(cwd)
        return None

    def execute_tool(self, tool_name: str, params: Optional[dict] = None, discussion_instance: Any = None,
                     *, workspace: Optional[PathLike] = None, timeout_s: Optional[float] = None,
                     **kwargs: Any) -> dict:
        """Run one tool in its library's worker; returns the LCP result dict.

        ``params``: a dict of the tool's parameters (or None); omitted ones take
        their literal defaults, parameters the tool does not take are dropped.
        ``discussion_instance=``, ``lollms_client_instance=`` and ``tool_context=``
        reach a tool that declares them as proxies to the host's objects.
        ``workspace=`` is this call's working directory (resolved against the
        host's CWD, created if missing; default: the binding's); ``timeout_s=`` this
        call's timeout.  Failures come back as result dicts with a
        ``status_code`` (see the README's "Result codes"); only a ``params`` that is
        not a mapping raises (``TypeError``)."""
        route = self._routes.get(tool_name)
        if route is None:
            return normalize.not_found(tool_name)
        if params is None:
            params = dict(route.defaults)
        elif type(params) is dict or isinstance(params, Mapping):
            params = {**route.defaults, **params}
        else:
            raise TypeError(f"execute_tool({tool_name!r}): params must be a dict of parameter names "
                            f"to values (or None), not {type(params).__name__}")
        lib = route.library
        if self._closed:
            return normalize.failure(f"[{lib.name}] {self._closed_text(tool_name)}", normalize.UNAVAILABLE)
        injected = None
        objects = HostObjects(self._named_for(route.library))    # one per call: released when it ends
        if discussion_instance is not None or kwargs or not params.keys().isdisjoint(HOST_PARAMS):
            values = {"discussion_instance": discussion_instance,
                      "tool_context": kwargs.get("tool_context") or params.get("tool_context"),
                      "lollms_client_instance": kwargs.get("lollms_client_instance")
                      or params.get("lollms_client_instance")}
            for k in HOST_PARAMS:
                params.pop(k, None)
            if any(v is not None for v in values.values()):
                injected = {k: objects.lend(v) for k, v in values.items() if v is not None}
        # One resolution, here, against the host's CWD (never the worker's).
        cwd = os.path.realpath(workspace) if workspace else (self.workspace or os.getcwd())
        refused = self._check_workspace(lib, tool_name, cwd)
        if refused is not None:
            return refused
        root = self._root(lib, cwd)
        msg = P.Call(tool_name, route.index, params, cwd, injected, self._handlers_mask())
        try:
            return self.supervisor.run(self.tenant, lib, msg, init=lambda: self._init(lib, root),
                                       limits=self._limits(lib), objects=objects, tool=tool_name,
                                       timeout_s=timeout_s, root=root)
        except SandboxEvent as ev:
            log.warning("%s", ev)
            return ev.result

    async def aexecute_tool(self, tool_name: str, params: Optional[dict] = None,
                            discussion_instance: Any = None, **kwargs: Any) -> dict:
        """``execute_tool`` for asyncio callers (same arguments and results): the
        call waits in a thread, never on the event loop."""
        if self._closed:
            return self.execute_tool(tool_name, params, discussion_instance, **kwargs)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="lcp-sandbox-call")
        loop = asyncio.get_running_loop()
        call = functools.partial(self.execute_tool, tool_name, params, discussion_instance, **kwargs)
        try:
            future = loop.run_in_executor(self._executor, call)
        except RuntimeError:                # close() shut the executor down meanwhile
            if not self._closed:
                raise
            return call()                   # the closed binding's 503, at once
        return await future

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

    # ------------------------------------------------------------ handlers

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

    # ------------------------------------------------------------ dynamic tools

    def register_tool_from_code(self, tool_name_prefix: str, code: str) -> bool:
        """Add the ``tool_*`` functions of ``code`` as a library of their own.

        The host only parses ``code`` (schemas); it runs in a worker of its own, at
        the library's first call.  Registering the same prefix again replaces the
        library (its worker is stopped).  Returns False when ``code`` does not parse
        or defines no tool.  These tools win over file tools of the same name and
        survive ``discover_tools(force_refresh=True)``."""
        try:
            lib, parsed = discovery.dynamic_library(tool_name_prefix, code)
        except SyntaxError as exc:
            log.error("register_tool_from_code(%r): %s", tool_name_prefix, exc)
            return False
        if not parsed.tools:
            return False
        # Import it (in its own worker, never here) before answering: code that fails at
        # import is refused, as in-process, and a previous registration stays as it was.
        self.supervisor.stop(self.tenant, lib.key)
        cwd = self.workspace or os.getcwd()
        root = self._root(lib, cwd)
        try:
            failed = self.supervisor.run(self.tenant, lib, P.Load(cwd, self._handlers_mask()),
                                         init=lambda: self._init(lib, root), limits=self._limits(lib),
                                         objects=HostObjects(self._named_for(lib)),
                                         tool=f"register_tool_from_code({tool_name_prefix!r})", root=root)
        except SandboxEvent as ev:
            failed = [str(ev.result.get("error")), ""]
        if failed is not None:
            self.supervisor.stop(self.tenant, lib.key)
            log.error("register_tool_from_code(%r) refused: the code %s", tool_name_prefix, failed[0])
            return False
        self._dynamic[tool_name_prefix] = (lib, parsed)
        self._discover()
        return True

    def unregister_tools_by_prefix(self, tool_name_prefix: str) -> int:
        """Forget the tools named ``tool_<prefix>...`` (or ``<prefix>``) and stop the
        worker of the library registered under that prefix; returns how many
        tools were removed."""
        def matches(name: str) -> bool:
            return name.startswith(f"tool_{tool_name_prefix}") or name == tool_name_prefix
        before = len(self.discovered_tools)
        self.discovered_tools = [t for t in self.discovered_tools if not matches(t.get("name", ""))]
        for name in [n for n in self._routes if matches(n)]:
            del self._routes[name]
        dyn = self._dynamic.pop(tool_name_prefix, None)
        if dyn is not None:
            self.supervisor.stop(self.tenant, dyn[0].key)
        return before - len(self.discovered_tools)

    # ------------------------------------------------------------ lifecycle

    def restart_library(self, library_name: str) -> bool:
        """Stop the worker(s) of the library ``library_name`` (this binding's tenant), so
        that its next call starts a fresh worker that imports the library's files again:
        for a library whose code changed on disk (module state is lost, and
        ``init_tools_library`` runs again).  Call ``discover_tools(force_refresh=True)``
        too when its tools may have changed.  Returns whether the library is known
        (whether or not a worker was running)."""
        libraries = {r.library.key for r in self._routes.values() if r.library.name == library_name}
        libraries |= {lib.key for lib, _, _ in self._prompt_providers.values() if lib.name == library_name}
        libraries |= {lib.key for lib, _ in self._dynamic.values() if lib.name == library_name}
        for key in libraries:
            self.supervisor.stop(self.tenant, key)
        return bool(libraries)

    def stats(self) -> list[dict]:
        """One dict per worker slot of this binding's tenant: ``library``, ``pid``,
        ``state``, ``calls``, ``restarts``, ``last_exit``, ``rss``, ``peak_rss``,
        ``protections``, ``workspace_root`` (see ``Supervisor.stats``)."""
        return self.supervisor.stats(tenant=self.tenant)

    def close(self) -> None:
        """Stop this binding's workers (and its own supervisor, if it made one).

        Idempotent.  Later calls are refused with 503; a shared supervisor keeps
        running for its other bindings."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        if self._own_supervisor:
            self.supervisor.close()
        else:
            libraries = {r.library.key for r in self._routes.values()}
            libraries |= {lib.key for lib, _, _ in self._prompt_providers.values()}
            libraries |= {lib.key for lib, _ in self._dynamic.values()}
            for key in libraries:
                self.supervisor.stop(self.tenant, key)

    def __enter__(self) -> "SandboxedBinding":
        """``with SandboxedBinding(...) as tools:`` closes the binding at the end."""
        return self

    def __exit__(self, *exc: Any) -> None:
        """Closes the binding (see ``close``)."""
        self.close()


# help() and inspect show the constructor's keywords, not __new__'s (*args, **kwargs).
_init_signature = inspect.signature(SandboxedBinding.__init__)
SandboxedBinding.__signature__ = _init_signature.replace(  # type: ignore[attr-defined]
    parameters=list(_init_signature.parameters.values())[1:], return_annotation=inspect.Signature.empty)


def _inside(real: str, root: str) -> bool:
    """Whether the resolved path ``real`` is ``root`` or under it."""
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _sendable(value: Any) -> bool:
    if is_plain(value):
        return True
    if callable(value):
        return False
    try:
        pickle.dumps(value)
        return True
    except Exception:
        return False


class LibraryHandle:
    """A mounted library as lollms hosts see it (``binding.mounted_libraries[name]``).

    ``hasattr`` answers from the source (AST); calling a function runs it in the
    library's worker, e.g. ``handle.init_tools_library({"autonomy_level": "strict"})``."""

    def __init__(self, binding: SandboxedBinding, library: discovery.Library) -> None:
        self._binding = binding
        self._library = library
        self.__name__ = library.name

    def __getattr__(self, name: str) -> Any:
        cache = self._binding._cache
        names = set().union(*(getattr(cache.parse(Path(f)), "function_names", frozenset())
                              for f in self._library.files)) if self._library.files else set()
        if name not in names:
            raise AttributeError(f"library {self._library.name!r} has no function {name!r}")
        return lambda *args, **kwargs: self._binding.call_library_function(self._library, name, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<sandboxed library {self._library.name} ({self._library.key})>"
