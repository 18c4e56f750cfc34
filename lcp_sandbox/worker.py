"""The worker: one process serving one tool library, one call at a time.

    serve(sock) ── INIT ──► Worker(init): sys.path, limits, handler relays
        loop:  CALL ──► chdir(workspace) ─► lazy load file (import, hooks,
                        init_tools_library) ─► filter params, inject host
                        objects ─► tool(**kwargs) ─► normalize ─► RESULT
               PROMPT ─► prompt provider ─► RESULT
               SHUTDOWN / EOF ─► exit

Everything a tool does to the host (confirm, ask the user, use a host
object) goes through proxies over the same connection while the call is in
flight (see proxies.py).  The soft timeout arrives as SIGUSR1 and is turned
into ``ToolTimeout`` inside the tool's Python code.
"""
from __future__ import annotations

import atexit
import importlib.util
import inspect
import os
import signal
import sys
import tempfile
import traceback
import types
from pathlib import Path
from typing import Any, Optional

from . import confine, limits, normalize, wire
from .discovery import HOST_PARAMS
from .proxies import Channel, Proxy, error_reply

PERSISTENT_PREFIX = "lollms_client.tools_bindings.lcp.persistent_"
SOFT_TIMEOUT_SIGNAL = signal.SIGUSR1
HANDLER_CONFIRM = 1
HANDLER_UI = 2


class ToolTimeout(BaseException):
    """Raised inside a tool when its call ran past the timeout (soft stage)."""


class LoadFailed(Exception):
    pass


class _Entry:
    """A resolved tool: its function and what its signature accepts (computed once)."""
    __slots__ = ("fn", "names", "var_kw", "injectable")

    def __init__(self, fn: Any) -> None:
        sig = inspect.signature(fn)
        self.fn = fn
        self.var_kw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
        self.names = frozenset(n for n, p in sig.parameters.items()
                               if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL, p.POSITIONAL_ONLY))
        self.injectable = HOST_PARAMS if self.var_kw else HOST_PARAMS & self.names


class Worker:
    def __init__(self, conn: wire.Connection, init: dict) -> None:
        self.conn = conn
        self.ch = Channel(conn)
        self.library: str = init["library"]
        self.files: list[str] = init["files"]
        self.source: Optional[str] = init.get("source")
        self.configs: dict = init.get("configs") or {}
        self.max_result = int(init["limits"].get("max_result_mb", 64) * 1024 * 1024)
        self.modules: list[Optional[types.ModuleType]] = [None] * max(1, len(self.files))
        self.entries: dict[str, _Entry] = {}
        self.handlers = init.get("handlers", 0)
        self.in_tool = False
        if init.get("sys_path"):
            sys.path[:] = init["sys_path"]
        self.relays = {HANDLER_CONFIRM: Proxy(self.ch, "confirm", None),
                       HANDLER_UI: Proxy(self.ch, "ui", None)}

    # ------------------------------------------------------------ loading
    def _stem(self, index: int) -> str:
        return Path(self.files[index]).stem if self.files else self.library

    def _relay(self, bit: int) -> Optional[Proxy]:
        return self.relays[bit] if self.handlers & bit else None

    def _config(self, stem: str) -> dict:
        """host_tool_configs[stem] with host callables as relays and handlers injected."""
        cfg = dict(self.ch.wrap(self.configs.get(stem) or {}))
        for key, bit in (("confirm_handler", HANDLER_CONFIRM), ("user_interaction_handler", HANDLER_UI)):
            if self.handlers & bit and key not in cfg:
                cfg[key] = self.relays[bit]
        return cfg

    def _load(self, index: int) -> types.ModuleType:
        stem = self._stem(index)
        name = (PERSISTENT_PREFIX + stem) if self.files else f"lcp_dynamic_{self.library}"
        try:
            if self.files:
                spec = importlib.util.spec_from_file_location(name, self.files[index])
                if spec is None or spec.loader is None:
                    raise ImportError(f"cannot import {self.files[index]}")
                mod = importlib.util.module_from_spec(spec)
                sys.modules[name] = mod
                spec.loader.exec_module(mod)
            else:
                mod = types.ModuleType(name)
                sys.modules[name] = mod
                exec(compile(self.source, f"<dynamic tool {self.library}>", "exec"), mod.__dict__)
            cfg = self._config(stem)
            for hook, key, bit in (("set_confirm_handler", "confirm_handler", HANDLER_CONFIRM),
                                   ("set_user_interaction_handler", "user_interaction_handler", HANDLER_UI)):
                fn = getattr(mod, hook, None)
                if callable(fn):
                    try:
                        fn(cfg.get(key, self._relay(bit)))
                    except Exception:
                        pass        # as in-process: a failing hook does not stop the load
            init_fn = getattr(mod, "init_tools_library", None)
            if callable(init_fn):
                params = inspect.signature(init_fn).parameters.values()
                if any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params):
                    init_fn(cfg)
                else:
                    init_fn()
        except BaseException as exc:
            sys.modules.pop(name, None)
            if isinstance(exc, SystemExit):
                what = f"called sys.exit({exc.code!r})"
            else:
                what = f"raised {type(exc).__name__}: {exc}"
            raise LoadFailed(f"{what} while loading {self.files[index] if self.files else 'its code'}\n"
                             + traceback.format_exc()) from None
        self.modules[index] = mod
        return mod

    def _entry(self, tool: str, index: int) -> Optional[_Entry]:
        entry = self.entries.get(tool)
        if entry is None:
            mod = self.modules[index] or self._load(index)
            fn = getattr(mod, tool, None)
            if not callable(fn):
                return None
            entry = self.entries[tool] = _Entry(fn)
        return entry

    def set_handlers(self, mask: int) -> None:
        """The host's handlers changed: patch loaded modules as in-process set_*_handler does."""
        self.handlers = mask
        for mod in self.modules:
            if mod is None:
                continue
            for hook, attr, bit in (("set_confirm_handler", "_CONFIRM_HANDLER", HANDLER_CONFIRM),
                                    ("set_user_interaction_handler", None, HANDLER_UI)):
                relay = self._relay(bit)
                fn = getattr(mod, hook, None)
                try:
                    if callable(fn):
                        fn(relay)
                    if attr and hasattr(mod, attr):
                        setattr(mod, attr, relay)
                except Exception:
                    pass

    # ------------------------------------------------------------ calling
    def call(self, tool: str, index: int, params: dict, cwd: str, injected: Optional[dict],
             handlers: int) -> tuple[Any, Optional[dict]]:
        if handlers != self.handlers:
            self.set_handlers(handlers)
        try:
            os.chdir(cwd)
        except OSError as exc:
            return normalize.failure(f"[{self.library}] {tool}: cannot enter the workspace {cwd!r}: {exc}"), None
        try:
            entry = self._entry(tool, index)
        except LoadFailed as exc:
            return self._load_failure(tool, exc), {"retire": True}
        if entry is None:
            return normalize.failure(f"[{self.library}] Function '{tool}' not found in module."), None

        if entry.var_kw:
            kwargs = {k: v for k, v in params.items() if k not in HOST_PARAMS}
        else:
            names = entry.names
            kwargs = {k: v for k, v in params.items() if k in names and k not in HOST_PARAMS}
        if entry.injectable:
            if injected:
                for k, v in injected.items():
                    if k in entry.injectable:
                        kwargs[k] = self.ch.wrap(v)
            if self.handlers & HANDLER_UI and "user_interaction_handler" in entry.injectable:
                kwargs["user_interaction_handler"] = self.relays[HANDLER_UI]

        self.in_tool = True
        try:
            out = entry.fn(**kwargs)
        except ToolTimeout:
            return None, {"event": "timeout"}
        except MemoryError as exc:
            return None, {"event": "memory", "detail": f"MemoryError: {exc}"}
        except BaseException as exc:
            return normalize.crashed(tool, exc, traceback.format_exc()), None
        finally:
            self.in_tool = False
        try:
            return normalize.normalize(out, cwd), None
        except Exception as exc:
            return normalize.crashed(tool, exc, traceback.format_exc()), None

    def _load_failure(self, tool: str, exc: LoadFailed) -> dict:
        msg, _, tb = str(exc).partition("\n")
        return normalize.failure(
            f"Tool initialization failed for '{self.library}': the library {msg}. "
            f"The tool '{tool}' did not run; the library will be loaded again on the next call.",
            traceback=tb)

    def modcall(self, fn_name: str, index: int, args: tuple, kwargs: dict, cwd: str,
                handlers: int) -> tuple[Any, Optional[dict]]:
        """A module-level function called by the host (e.g. init_tools_library again)."""
        if handlers != self.handlers:
            self.set_handlers(handlers)
        try:
            os.chdir(cwd)
            mod = self.modules[index] or self._load(index)
            fn = getattr(mod, fn_name)
            value = fn(*(self.ch.wrap(a) for a in args), **{k: self.ch.wrap(v) for k, v in kwargs.items()})
            return value, None
        except LoadFailed as exc:
            return None, {"raised": ("RuntimeError", (f"library {self.library} failed to load: {exc}",)),
                          "retire": True}
        except BaseException as exc:
            return None, {"raised": error_reply(exc)[2]}

    def prompt(self, fn_name: str, index: int, cwd: str, handlers: int) -> tuple[Optional[str], None]:
        """A dynamic prompt provider; None when it is missing or fails (as in-process)."""
        if handlers != self.handlers:
            self.set_handlers(handlers)
        try:
            os.chdir(cwd)
            mod = self.modules[index] or self._load(index)
            fn = getattr(mod, fn_name, None)
            return (str(fn()) if callable(fn) else None), None
        except Exception:
            return None, None

    def reply(self, result: Any, info: Optional[dict]) -> None:
        try:
            data = wire.dumps((wire.RESULT, result, info))
        except wire.PayloadError as exc:
            data = wire.dumps((wire.RESULT, normalize.failure(
                f"[{self.library}] the result could not be sent back to the host: {exc}. "
                "The worker was kept."), info))
        if len(data) > self.max_result:
            data = wire.dumps((wire.RESULT, normalize.failure(
                f"[{self.library}] the result is {len(data) / 1048576:.1f} MB, over the "
                f"{self.max_result / 1048576:.0f} MB cap; it was dropped and the worker was kept."), info))
        self.conn.send_bytes(data)


def rehearse() -> None:
    """A dry run of a first call, in a spare worker before it is needed.

    A forked process copies every page it writes to, and CPython writes to
    every object it touches (reference counts): the first call of a fresh worker
    paid for hundreds of page copies.  Walking the same paths on a throwaway
    library while waiting moves most of them off the critical path."""
    init = {"library": "_rehearsal", "files": [], "source": _REHEARSAL, "configs": {}, "handlers": 0,
            "sys_path": None, "env": dict(os.environ), "confine": None,
            "limits": {"max_result_mb": 64}}
    init = wire.pickle.loads(wire.dumps((wire.INIT, init)))[1]
    worker = Worker(None, init)
    msg = wire.pickle.loads(wire.dumps((wire.CALL, "tool_rehearse", 0, {"a": 1, "b": "x"}, os.getcwd(), None, 0)))
    worker.ch.in_call = True
    for _ in range(2):
        value, info = worker.call(*msg[1:])
        wire.pickle.loads(wire.dumps((wire.RESULT, value, info)))
    worker.ch.end_call()
    normalize.normalize({"success": False, "error": "e", "data": 1}, os.getcwd())
    sys.modules.pop("lcp_dynamic__rehearsal", None)


_REHEARSAL = '''
def tool_rehearse(a: int, b: str = "", tool_context=None) -> dict:
    """Nothing."""
    return {"success": True, "output": {"a": a, "b": b}}
'''


def prepare(init: dict) -> dict:
    """Environment, confinement and limits of this worker, before any tool code runs.

    Returns what is in force, for the host's stats()."""
    lim = init["limits"]
    report: dict = {"env": "host environment"}
    conf = init.get("confine")
    if conf is not None:
        confine.clean_environment(lim.get("env"), init.get("env") or {})
        report["env"] = "clean (allowlist" + (" + library env)" if lim.get("env") else ")")
    elif init.get("env") is not None:
        os.environ.clear()
        os.environ.update(init["env"])
        os.environ.update({str(k): str(v) for k, v in (lim.get("env") or {}).items()})
    disabled = set(init.get("disabled") or ())     # LCP_SANDBOX_DISABLE in the host, for tests
    if lim.get("network", True):
        report["network"] = "host network"
    else:
        report["network"] = ("unavailable (disabled by LCP_SANDBOX_DISABLE)" if "netns" in disabled
                             else confine.isolate_network())
    if conf is not None:
        # The namespace above, this temp dir and Landlock's rule paths need the host's
        # privileges (as root: CAP_SYS_ADMIN, creating in and opening anything); the
        # privileges are dropped after them, seccomp last.  See confine.py.
        tmp = confine.private_tmpdir(conf.get("run_as"))
        os.environ["TMPDIR"] = tempfile.tempdir = tmp
        report["tmpdir"] = tmp
        ro = [*conf.get("read_paths", ()), *confine.python_paths(), *confine.SYSTEM_READ_PATHS,
              os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        covered = confine.make_reachable([conf["root"], tmp, *ro], conf.get("run_as"))
        if "landlock" in disabled:
            report["filesystem"] = "unavailable (disabled by LCP_SANDBOX_DISABLE)"
        else:
            report["filesystem"] = confine.apply_landlock([conf["root"], tmp], ro, confine.DEVICES)
        if covered:
            report["filesystem"] += "; " + covered
        report["privileges"] = confine.drop_privileges(conf.get("run_as"))
        report["unix_sockets"] = ("not blocked (network on)" if lim.get("network", True)
                                  else confine.block_unix_sockets())
    else:
        report["filesystem"] = "unrestricted"
        report["privileges"] = f"the host's (uid {os.geteuid()}, not confined)"
        report["unix_sockets"] = "not blocked (not confined)"
    limits.apply_in_worker(lim)
    return report


def serve(sock) -> None:
    """Run the worker loop on a connected socket; never returns."""
    conn = wire.Connection(sock)
    code = 0
    try:
        kind, init = conn.recv()
        report = prepare(init)
        worker = Worker(conn, init)
        conn.send((wire.READY, report))
        ch = worker.ch

        def on_soft_timeout(signum: int, frame: Any) -> None:
            if worker.in_tool and not ch.waiting_host:
                raise ToolTimeout()
        signal.signal(SOFT_TIMEOUT_SIGNAL, on_soft_timeout)

        recv = conn.recv
        ops = {wire.CALL: worker.call, wire.MODCALL: worker.modcall, wire.PROMPT: worker.prompt}
        while True:
            try:
                msg = recv()
            except EOFError:
                break
            op = ops.get(msg[0])
            if op is None:                       # SHUTDOWN
                break
            ch.call_seq += 1
            ch.in_call = True
            try:
                value, info = op(*msg[1:])
            finally:
                ch.end_call()
            worker.reply(value, info)
            if info and info.get("retire"):      # the library failed to load: start afresh
                break
    except BaseException:
        code = 70
        try:
            traceback.print_exc()
        except Exception:
            pass
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(code)
