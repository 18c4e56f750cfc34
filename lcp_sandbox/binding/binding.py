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
        backend.run(spec, Call, objects) ─► result dict       (spec: which worker, cached)

What tools exist: binding/tool_catalog.py; the rest of the LCPBinding surface:
binding/lcp_surface.py; processes: behind the Backend (backends/base.py).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Optional, Union

from .. import protocol as P
from ..backends.base import Backend, WorkerSpec
from ..backends.local.supervisor import Supervisor
from ..core import discovery, normalize
from ..core.host_configs import config_limits
from ..core.limits import Limits, check_together
from ..core.outcomes import CallFailed, SandboxEvent
from ..core.secrets import host_secrets, settled
from ..protocol import HANDLER_CONFIRM, HANDLER_UI, HOST_PARAMS
from .lcp_surface import LcpSurface
from .locations import as_paths, bundled_tools_dir, lollms_default_tools_dir
from .objects import HostObjects, NamedRefs
from .settings_check import check_arguments, check_entry_names
from .tool_catalog import ToolCatalog
from .worker_init import build_init, read_declarations
from .workspaces import Workspaces

log = logging.getLogger("lcp_sandbox")

PathLike = Union[str, Path]


class SandboxedBinding(LcpSurface):
    """Drop-in for lollms_client's ``LCPBinding`` that runs each tool library in a
    long-lived worker process of its own (module state survives between calls).

    Constructor keywords (all optional; the first may be given by position):

    host_tool_configs
        ``{library stem: dict}``, as ``LCPBinding``: passed to the library's
        ``init_tools_library`` and to tools that read their host config.  Its
        ``"sandbox"`` entry sets that library's limits (core/limits.py, the table of
        docs/configuration.md): a wrong one makes the library's calls answer 500 naming
        it.  An entry of no library is logged; one holding "sandbox", a slip of "sandbox"
        ("Sandbox") or a "sandbox" that is no dict is refused here (core/host_configs.py).
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
        The tools' working directory (the worker's CWD during a call), resolved against
        the host's CWD when the binding is made.  Default: the host's CWD at each call.
        A workspace that does not exist is created by the first call that uses it.
    tenant
        Who the calls are for (default ``"default"``).  Workers are keyed by
        (tenant, library): tenants never share a worker or its module state.
    timeout_s
        Timeout of a call in seconds (default 60; ``None`` or 0: none).
        ``host_tool_configs[stem]["sandbox"]["timeout_s"]`` and
        ``execute_tool(..., timeout_s=)`` override it.
    memory_mb
        Memory limit of each worker (``RLIMIT_DATA``, and a watchdog over the USS
        of its process tree).  Default: none.
    supervisor
        A ``Supervisor`` shared with other bindings.  Default: one of the
        binding's own, closed by ``close()``.
    confine
        Confine the workers (docs/security.md): True (a worker whose protections are not
        all in force runs nothing: 503), False, or "best-effort" (run with what the system
        has).  Default: the supervisor's ``confine``.
    workspace_root
        A call whose workspace is not inside this folder is refused with 403;
        confined workers are confined to it.
    network
        Its libraries' network: True (the host's), False (loopback only), or for confined
        workers a policy, ``{"allow": [rules], "deny": [rules]}`` (core/egress_rules.py),
        held by the supervisor's egress proxy.  Default: the supervisor's (True).
    secrets
        ``{"NAME": "value"}``, over the supervisor's: a policy's ``"secrets"`` binds a name
        to hosts, and the egress proxy puts the value in requests to them; the worker holds
        a placeholder only (core/secrets.py, docs/network.md).  Default: none of its own.
    other keywords
        Load flags, as ``LCPBinding``: a library declaring ``TOOL_LIBRARY_LOAD_FLAG = "X"``
        loads only when ``X=True`` is given here or in its ``host_tool_configs`` entry.
        A keyword one slip from a keyword above (``confined=``, ``Confine=``), or naming
        a supervisor keyword or a "sandbox" setting, is a TypeError (core/keywords.py).

    Use it as a context manager, or call ``close()``.  A front may register a
    subclass to build instead once a module is imported (``promote_when``): the
    lollms front makes it a ``LollmsToolBinding`` once lollms_client's tools
    binding module is loaded.
    """

    #: (module name, subclass factory): once that module is imported, a new
    #: ``SandboxedBinding(...)`` is an instance of the factory's subclass.  A front
    #: registers itself here (fronts/lollms.py: lollms_client's tools binding).
    _promotions: ClassVar[list[tuple[str, Callable[[], type]]]] = []

    @classmethod
    def promote_when(cls, module: str, subclass: Callable[[], type]) -> None:
        """Make ``SandboxedBinding(...)`` build ``subclass()`` once ``module`` is imported."""
        cls._promotions.append((module, subclass))

    def __new__(cls, *args: Any, **kwargs: Any) -> "SandboxedBinding":
        if cls is SandboxedBinding:
            for module, subclass in cls._promotions:
                if module in sys.modules:
                    cls = subclass()
                    break
        return super().__new__(cls)

    def __init__(self, host_tool_configs: Optional[dict] = None, *, tools_folders: Any = None,
                 tool_files: Any = None, confirm_handler: Optional[Callable] = None,
                 user_interaction_handler: Optional[Callable] = None,
                 workspace: Optional[PathLike] = None, tenant: str = "default",
                 timeout_s: Optional[float] = 60.0, memory_mb: Optional[float] = None,
                 supervisor: Optional[Backend] = None, confine: Optional[Union[bool, str]] = None,
                 workspace_root: Optional[PathLike] = None,
                 network: Union[bool, dict[str, Any], None] = None,
                 secrets: Optional[dict[str, str]] = None, **kwargs: Any) -> None:
        check_arguments(locals(), kwargs)
        # (values stay in the host: the supervisor's egress proxy puts them in requests)
        self._secrets: Mapping[str, str] = host_secrets(secrets, "SandboxedBinding: secrets")
        self.binding_name = "sandboxed"
        self.host_tool_configs: dict = host_tool_configs if host_tool_configs is not None else {}
        self.confirm_handler = confirm_handler
        self.user_interaction_handler = user_interaction_handler
        files = as_paths(tool_files)
        folders = as_paths(tools_folders or kwargs.get("tools_folder_path"))
        if not folders and not files:
            folders = [lollms_default_tools_dir() or bundled_tools_dir()]
        self.workspace = os.path.realpath(workspace) if workspace else None
        self.tenant = tenant
        self.workspace_root = os.path.realpath(workspace_root) if workspace_root else None
        self.catalog = ToolCatalog(folders, files, self.host_tool_configs, kwargs,
                                   lollms_default_tools_dir, self._derived_stale)
        self._reachable = check_entry_names(self.host_tool_configs, self.catalog, files)
        self._own_supervisor = supervisor is None
        self.supervisor = supervisor or Supervisor()
        self.limits = check_together(Limits(
            timeout_s=timeout_s, memory_mb=memory_mb,
            confine=self.supervisor.confine if confine is None else confine,
            network=self.supervisor.network if network is None else network))
        self._lib_limits: dict[str, Limits] = {}
        # (library key, root) -> its worker's spec.
        self._specs: dict[tuple, WorkerSpec] = {}
        self._resolvers: dict[str, NamedRefs] = {}
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._workspaces = Workspaces(tenant, self.workspace_root)
        self._closed = False
        self.catalog.discover()

    def _derived_stale(self) -> None:
        """Discovery ran again: limits and worker specs are derived anew; what the
        libraries declare they need is read now (parsed here, not in a first call)."""
        self._lib_limits.clear()
        self._specs.clear()
        read_declarations({r.library.key: r.library for r in self.catalog.routes.values()}
                          .values())

    def discover_tools(self, specific_tool_names: Optional[list] = None,
                       **kwargs: Any) -> list[dict]:
        """The LCP specs of the tools (``name``, ``description``, ``input_schema``, and
        private ``_`` keys), built from source with ``ast``: no tool code runs here.

        ``specific_tool_names`` keeps only those; ``force_refresh=True`` scans the
        folders again (unchanged files are not parsed again).  A tool whose
        description comes from a ``tool_<name>_prompt`` function gets it from a
        run of that function in the library's worker."""
        if kwargs.get("force_refresh", False) or not self.discovered_tools:
            self.catalog.discover()
        tools = self.discovered_tools
        if specific_tool_names:
            tools = [t for t in tools if t.get("name") in specific_tool_names]
        for spec in tools:
            route = self.catalog.routes.get(spec["name"])
            if spec.get("_has_dynamic_prompt") and route is not None:
                text = self._prompt(route.library, spec["_dynamic_prompt_fn_name"],
                                    spec["_dynamic_prompt_file_index"])
                if text:
                    spec["description"] = text
        return tools

    def _prompt(self, lib: discovery.Library, fn: str, index: int) -> Optional[str]:
        if self._closed:
            return None
        cwd = self.workspace or os.getcwd()
        refused = self._workspaces.check(lib.name, fn, cwd)
        if refused is not None:
            log.warning("%s", refused["error"])
            return None
        msg = P.Prompt(fn, index, cwd, self._handlers_mask())
        try:
            return self.supervisor.run(self._spec(lib, cwd), msg, HostObjects(self._named(lib)),
                                       tool=fn)
        except SandboxEvent as ev:
            log.warning("prompt provider %s of %s failed: %s", fn, lib.name, ev)
            return None

    def call_library_function(self, lib: discovery.Library, fn: str, *args: Any,
                              **kwargs: Any) -> Any:
        """Run a module-level function of a library in its worker; returns its value.

        Raises ``RuntimeError`` with the sandbox's explanation when the call fails
        in the sandbox (closed binding, crash, timeout...)."""
        if self._closed:
            raise RuntimeError(self._closed_text(fn))
        index = self.catalog.file_index(lib, fn)
        objects = HostObjects(self._named(lib))
        cwd = self.workspace or os.getcwd()
        refused = self._workspaces.check(lib.name, fn, cwd)
        if refused is not None:
            raise RuntimeError(refused["error"])
        msg = P.ModCall(fn, index, tuple(objects.lend(a) for a in args),
                        {k: objects.lend(v) for k, v in kwargs.items()}, cwd, self._handlers_mask())
        try:
            return self.supervisor.run(self._spec(lib, cwd), msg, objects, tool=fn)
        except SandboxEvent as ev:
            raise RuntimeError(ev.result["error"]) from None

    # ------------------------------------------------------------ execution
    def _handlers_mask(self) -> int:
        return (HANDLER_CONFIRM if self.confirm_handler is not None else 0) | \
               (HANDLER_UI if self.user_interaction_handler is not None else 0)

    def _named(self, lib: discovery.Library) -> NamedRefs:
        named = self._resolvers.get(lib.key)
        if named is None:
            named = self._resolvers[lib.key] = NamedRefs(self, lib)
        return named

    def _limits(self, lib: discovery.Library) -> Limits:
        lim = self._lib_limits.get(lib.key)
        if lim is None:
            lim = config_limits(self.limits, self.host_tool_configs, lib.name, self._reachable)
            try:
                settled(lim.network, self.host_tool_configs.get(lib.name),
                        {*self.supervisor.secret_names, *self._secrets}, lib.name)
            except ValueError as exc:
                raise CallFailed(f"[{lib.name}] not run: {exc}") from None
            self._lib_limits[lib.key] = lim
        return lim

    def _spec(self, lib: discovery.Library, cwd: str) -> WorkerSpec:
        """The worker a call of ``lib`` in the workspace ``cwd`` goes to.

        A confined worker serves one root for life (Landlock rules cannot be
        widened): the tenant's workspace root, or else the one workspace it was
        started for, so another workspace gets another worker."""
        limits = self._limits(lib)
        root = (self.workspace_root or os.path.realpath(cwd)) if limits.confine else ""
        spec = self._specs.get((lib.key, root))
        if spec is None or spec.library is not lib or spec.limits is not limits:
            if len(self._specs) >= 4096:
                self._specs.clear()
            spec = self._specs[(lib.key, root)] = WorkerSpec(
                self.tenant, lib, limits, root, functools.partial(self._init, lib, limits, root),
                self._secrets)
        return spec

    def _init(self, lib: discovery.Library, limits: Limits, root: str) -> P.Init:
        """The INIT of a new worker of ``lib``, with the configs and handlers of the moment."""
        return build_init(lib, limits, root, self.host_tool_configs, self._handlers_mask())

    def _closed_text(self, tool: str) -> str:
        return f"tool '{tool}' not run: this SandboxedBinding (tenant {self.tenant!r}) is closed."

    def execute_tool(self, tool_name: str, params: Optional[dict] = None,
                     discussion_instance: Any = None, *, workspace: Optional[PathLike] = None,
                     timeout_s: Optional[float] = None, **kwargs: Any) -> dict:
        """Run one tool in its library's worker; returns the LCP result dict.

        ``params``: a dict of the tool's parameters (or None); omitted ones take
        their literal defaults, parameters the tool does not take are dropped.
        ``discussion_instance=``, ``lollms_client_instance=`` and ``tool_context=``
        reach a tool that declares them as proxies to the host's objects.
        ``workspace=`` is this call's working directory (resolved against the
        host's CWD, created if missing; default: the binding's); ``timeout_s=`` this
        call's timeout.  Failures come back as result dicts with a
        ``status_code`` (see docs/results.md); only a ``params`` that is
        not a mapping raises (``TypeError``)."""
        route = self.catalog.routes.get(tool_name)
        if route is None:
            return normalize.not_found(tool_name)
        if params is None:
            params = dict(route.defaults)
        elif type(params) is dict or isinstance(params, Mapping):
            params = {**route.defaults, **params}
        else:
            raise TypeError(f"execute_tool({tool_name!r}): params must be a dict of parameter "
                            f"names to values (or None), not {type(params).__name__}")
        lib = route.library
        if self._closed:
            return normalize.failure(f"[{lib.name}] {self._closed_text(tool_name)}",
                                     normalize.UNAVAILABLE)
        injected = None
        # One per call: released when it ends.
        objects = HostObjects(self._named(route.library))
        if discussion_instance is not None or kwargs or not params.keys().isdisjoint(HOST_PARAMS):
            values = {"discussion_instance": discussion_instance,
                      "tool_context": kwargs.get("tool_context") or params.get("tool_context"),
                      "lollms_client_instance": kwargs.get("lollms_client_instance")
                      or params.get("lollms_client_instance")}
            for k in HOST_PARAMS:
                params.pop(k, None)
            injected = objects.lend_named(values)
        # One resolution, here, against the host's CWD (never the worker's).
        cwd = os.path.realpath(workspace) if workspace else (self.workspace or os.getcwd())
        refused = self._workspaces.check(lib.name, tool_name, cwd)
        if refused is not None:
            return refused
        # P.Call built without its Python __new__
        msg = tuple.__new__(P.Call, (tool_name, route.index, params, cwd, injected,
                                     self._handlers_mask(), 0))
        try:
            return self.supervisor.run(self._spec(lib, cwd), msg, objects, tool=tool_name,
                                       timeout_s=timeout_s)
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
            self._executor = concurrent.futures.ThreadPoolExecutor(
                64, thread_name_prefix="lcp-sandbox-call")
        loop = asyncio.get_running_loop()
        call = functools.partial(self.execute_tool, tool_name, params, discussion_instance,
                                 **kwargs)
        try:
            future = loop.run_in_executor(self._executor, call)
        # close() shut the executor down meanwhile.
        except RuntimeError:
            if not self._closed:
                raise
            # The closed binding's 503, at once.
            return call()
        return await future

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
        try:
            failed = self.supervisor.run(self._spec(lib, cwd), P.Load(cwd, self._handlers_mask()),
                                         HostObjects(self._named(lib)),
                                         tool=f"register_tool_from_code({tool_name_prefix!r})")
        except SandboxEvent as ev:
            failed = [str(ev.result.get("error")), ""]
        if failed is not None:
            self.supervisor.stop(self.tenant, lib.key)
            log.error("register_tool_from_code(%r) refused: the code %s", tool_name_prefix,
                      failed[0])
            return False
        self.catalog.dynamic[tool_name_prefix] = (lib, parsed)
        self.catalog.discover()
        return True

    # ------------------------------------------------------------ controls
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

    # ------------------------------------------------------------ lifecycle
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
            for key in self.catalog.library_keys():
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
    parameters=list(_init_signature.parameters.values())[1:],
    return_annotation=inspect.Signature.empty)
