"""The constructors' keywords, checked before anything starts.

    checked_keywords(owner, values) ─► {keyword: value checked}, or TypeError/ValueError
                                       naming the owner and the keyword
    check_load_flags(kwargs)        ─► the keywords SandboxedBinding takes as lollms load
                                       flags; TypeError for one that is a slip of a setting

What each keyword holds is a kind of core/kinds.py, or a setting with a checker of its own
(confine, network, run_as, uid_range).  A keyword that is not a setting of the binding
is a load flag (``TOOL_LIBRARY_LOAD_FLAG``, as ``LCPBinding``) unless it is a slip
(core/spelling.py) of a keyword of the binding, or is, or is a slip of, a keyword of a
supervisor or a ``"sandbox"`` setting: taken for a flag, it would leave its protection out.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from .kinds import check_kind
from .limits import Limits, confine_setting, network_setting
from .policy import run_as_setting, uid_range_setting
from .secrets import host_secrets
from .spelling import near_miss

#: Settings with a checker of their own (None: the owner's default, where it has one).
_OWN: dict[str, Callable[[Any], Any]] = {
    "confine": confine_setting, "network": network_setting, "run_as": run_as_setting,
    "uid_range": uid_range_setting, "secrets": lambda v: host_secrets(v, "secrets")}

#: SandboxedBinding's keywords (``tools_folder_path``: LCPBinding's other name of
#: ``tools_folders``; ``supervisor``: whatever has a Backend's methods).
BINDING = {"host_tool_configs": "dict|None", "tools_folders": "folders|None",
           "tools_folder_path": "folders|None", "tool_files": "folders|None",
           "confirm_handler": "callable|None", "user_interaction_handler": "callable|None",
           "workspace": "path|None", "tenant": "str", "timeout_s": "number|None",
           "memory_mb": "number|None", "supervisor": "backend|None", "confine": "confine|None",
           "workspace_root": "path|None", "network": "network|None",
           "secrets": "secrets|None"}

SUPERVISOR = {"max_workers": "count|None", "max_workers_per_tenant": "count|None",
              "idle_timeout_s": "number|None", "confine": "confine", "on_event": "callable|None",
              "crash_policy": "CrashPolicy|None", "watch_interval_s": "positive",
              "run_as": "run_as|None", "tenants_root": "path|None", "start_method": "str|None",
              "uid_range": "uid_range", "max_processes_per_tenant": "count|None",
              "network": "network", "envs_dir": "path|None", "env_wait_s": "number",
              "secrets": "secrets|None", "upstream_ca_file": "path|None"}

RAY_SUPERVISOR = {"address": "str|None", "max_workers_per_node": "count|None",
                  "max_workers_per_tenant": "count|None", "idle_timeout_s": "number|None",
                  "confine": "confine", "on_event": "callable|None",
                  "tenants_root": "path|None", "uid_range": "uid_range|None",
                  "envs_dir": "path|None", "env_wait_s": "number|None",
                  "secrets": "secrets|None", "upstream_ca_file": "path|None"}

TABLES = {"SandboxedBinding": BINDING, "Supervisor": SUPERVISOR, "RaySupervisor": RAY_SUPERVISOR}

#: What a Backend (backends/base.py) must have, as the binding uses it.
_BACKEND_METHODS = ("run", "stop", "stats", "close", "interrupt")


def _backend(name: str, value: Any) -> Any:
    if not all(callable(getattr(value, m, None)) for m in _BACKEND_METHODS):
        raise TypeError(f"{name!r} must be a Supervisor or RaySupervisor (a Backend), not "
                        f"{value!r} ({type(value).__name__})")
    return value


def _checked(name: str, value: Any, kind: str) -> Any:
    base, _, none_ok = kind.partition("|")
    if value is None and none_ok:
        return None
    if base in _OWN:
        return _OWN[base](value)
    if base == "backend":
        return _backend(name, value)
    return check_kind(name, value, kind)


def checked_keywords(owner: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of ``owner`` (a key of TABLES) found in ``values`` (the constructor's
    ``locals()``), each checked; the first wrong one raises, naming ``owner`` and it."""
    out = {}
    for name, kind in TABLES[owner].items():
        if name in values:
            try:
                out[name] = _checked(name, values[name], kind)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{owner}: {exc}") from None
    return out


def check_load_flags(flags: Mapping[str, Any]) -> None:
    """TypeError for a keyword of ``flags`` (SandboxedBinding's other keywords) that is a
    slip of one of its keywords, or is (or is a slip of) a supervisor keyword or a
    ``"sandbox"`` setting; the others are load flags."""
    elsewhere: dict[str, list[str]] = {}
    for owner, names in (("Supervisor", SUPERVISOR), ("RaySupervisor", RAY_SUPERVISOR),
                         ("sandbox", Limits.__dataclass_fields__)):
        for name in names:
            elsewhere.setdefault(name, []).append(owner)
    for flag in flags:
        meant = near_miss(flag, BINDING)
        if meant is not None:
            raise TypeError(f"SandboxedBinding() got {flag}=, which is no keyword of it: did "
                            f"you mean {meant}=? (a keyword one slip from a setting is never "
                            f"taken for a load flag: the setting would be left out)")
        other = flag if flag in elsewhere else near_miss(flag, elsewhere)
        if other is not None:
            places = " and ".join(_where(other, owner) for owner in elsewhere[other])
            raise TypeError(f"SandboxedBinding() got {flag}=, which is no keyword of it: "
                            f"{other!r} is {places}")


def _where(name: str, owner: str) -> str:
    if owner == "sandbox":
        return f'a setting of a library, host_tool_configs[library]["sandbox"][{name!r}]'
    return f"a keyword of {owner}, given as supervisor={owner}({name}=...)"
