"""Per-library sandbox settings: the host's configuration of a worker.

Read from ``host_tool_configs[stem]["sandbox"]`` over the binding's defaults;
sent to the worker in INIT as a dict, where worker/rlimits.py applies the
process limits and worker/confine/ the confinement.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional, Union

from .egress_rules import policy_of
from .kinds import check_kind
from .outcomes import CallFailed
from .policy import BEST_EFFORT, run_as_setting
from .spelling import closest
from .syscalls import check_setting

# An ext4 file system's own needs.
MIN_DISK_MB = 8


def confine_setting(value: Any) -> Union[bool, str]:
    """A ``confine`` setting checked: True, False or "best-effort" (None: False).  Exactly
    those: 1 and 1.0 are no True, "Best-Effort" is no "best-effort"."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value == BEST_EFFORT:
        return BEST_EFFORT
    raise ValueError(f"confine={value!r}: it is True, False or \"best-effort\"")


def network_setting(value: Any) -> Union[bool, dict[str, Any]]:
    """A ``network`` setting checked: True, False, or a policy (a dict of rules:
    core/egress_rules.py); TypeError/ValueError naming it."""
    if isinstance(value, bool):
        return value
    policy_of(value)
    policy: dict[str, Any] = value
    return policy


@dataclass
class Limits:
    """Per-library sandbox settings (``host_tool_configs[stem]["sandbox"]``)."""
    # None/0: no timeout.
    timeout_s: Optional[float] = 60.0
    # Soft interrupt -> hard kill.
    grace_s: float = 2.0
    # Kernel limit + watchdog on the process tree.
    memory_mb: Optional[float] = None
    # RLIMIT_CPU of the worker.
    cpu_s: Optional[int] = None
    max_open_files: int = 1024
    max_file_size_mb: Optional[float] = 4096
    max_result_mb: float = 64
    # Tool stdout/stderr forwarded to logging.
    log_bytes_per_s: int = 256 * 1024
    # confinement (worker/confine/); None: the binding's / supervisor's setting
    # True, False or "best-effort".
    confine: Optional[Union[bool, str]] = None
    # False: own network namespace, loopback.
    network: Union[bool, dict[str, Any]] = True
                                            # only; {"allow": [...], "deny": [...]}: that,
                                            # and the host's egress proxy (egress_rules.py)
    # Extra environment variables for the worker.
    env: Optional[dict[str, Any]] = None
    # Extra read-only paths for a confined worker.
    read_paths: tuple[str, ...] = ()
    # (uid, gid) of a confined worker of.
    run_as: Optional[Union[tuple[int, int], str]] = None
                                            # a root host, or "per-tenant"; None: the
                                            # supervisor's run_as
    # False: every worker imports the library itself.
    template: bool = True
                                            # (no shared template process: backends/local/
                                            # templates.py)
    # Confined, from files: may import in a template.
    trusted_import: bool = True
                                            # that can write beneath the tenants' folder
                                            # (False: imports after its own confinement)
    # Processes and threads of a confined worker's tree.
    max_processes: Optional[int] = None
                                            # (a pids cgroup of its own; it starts fresh)
    # Bytes its confinement root may hold: a file.
    disk_mb: Optional[int] = None
                                            # system of its own (backends/local/confine/disks.py)
    # The library's dependencies, given by the.
    requirements: Optional[tuple[str, ...]] = None
                                            # host (over what the library declares): its
                                            # workers get an environment of their own
    # {"allow": [names], "allow_dangerous": bool}: calls.
    syscalls: Optional[dict[str, Any]] = None
                                            # a confined worker adds to the allowlist
                                            # (core/syscalls.py; checked here)

    def __post_init__(self) -> None:
        for name in _ORDER:
            setattr(self, name, _checked(name, getattr(self, name)))

    @classmethod
    def merged(cls, base: "Limits", override: Optional[dict[str, Any]]) -> "Limits":
        """``base`` with the settings of ``override`` (None: none; anything but a dict,
        [] and False too, is refused: it would leave out every protection it meant)."""
        if override is None:
            return base
        if not isinstance(override, dict):
            raise TypeError(f"it must be a dict of settings, not {override!r} "
                            f"({type(override).__name__})")
        if not override:
            return base
        unknown = [k for k in override if k not in cls.__dataclass_fields__]
        if unknown:
            raise ValueError("; ".join(_unknown(k) for k in unknown))
        # "confine": None is the binding's confine, never None (which would read as off).
        given = {k: v for k, v in override.items() if not (k == "confine" and v is None)}
        # The base was checked when it was made: only what is given is checked again (in
        # __post_init__'s order, so the first wrong setting is the one named).
        merged = copy.copy(base)
        for name in _ORDER:
            if name in given:
                setattr(merged, name, _checked(name, given[name]))
        return merged


def _checked(name: str, value: Any) -> Any:
    """The setting ``name`` checked (TypeError/ValueError naming it), as Limits keeps it."""
    kind = _KINDS.get(name)
    if kind is not None:
        value = check_kind(name, value, kind)
        return tuple(value) if name in _TUPLES and value is not None else value
    if name == "network":
        return network_setting(value)
    if value is None:
        return None
    if name == "confine":
        return confine_setting(value)
    if name == "run_as":
        return run_as_setting(value)
    return check_setting(_allow_listed(value))


def _allow_listed(syscalls: Any) -> Any:
    """``syscalls`` whose "allow" is a list of names (TypeError naming it), for
    core/syscalls.py to check the names."""
    if isinstance(syscalls, dict) and "allow" in syscalls:
        check_kind('syscalls["allow"]', syscalls["allow"], "strings")
    return syscalls


def _unknown(key: Any) -> str:
    near = closest(key, Limits.__dataclass_fields__)
    return (f"{key!r} is no sandbox setting" + (f" (did you mean {near!r}?)" if near else
            f" (the settings: {', '.join(Limits.__dataclass_fields__)})"))


#: What each plain setting holds: "number", "int", "bool", "env", "paths", "strings",
#: optionally "|None".
#: (confine, run_as, syscalls and network are checked by their own functions.)
_KINDS = {"timeout_s": "number|None", "grace_s": "number", "memory_mb": "number|None",
          "cpu_s": "int|None", "max_open_files": "int", "max_file_size_mb": "number|None",
          "max_result_mb": "number", "log_bytes_per_s": "int",
          "env": "env|None", "read_paths": "paths", "template": "bool",
          "trusted_import": "bool", "max_processes": "int|None", "disk_mb": "int|None",
          "requirements": "strings|None"}
#: The plain settings kept as tuples.
_TUPLES = frozenset({"read_paths", "requirements"})
#: Every setting, in the order they are checked: the plain ones, then those with checks of
#: their own (confine, run_as, syscalls, network).
_ORDER = (*_KINDS, "confine", "run_as", "syscalls", "network")


def count_setting(name: str, value: Any) -> Optional[int]:
    """A positive whole number, or None (no cap); TypeError/ValueError naming ``name``."""
    checked: Optional[int] = check_kind(name, value, "count|None")
    return checked


def library_limits(base: Limits, override: Optional[dict[str, Any]], library: str) -> Limits:
    """A library's limits; settings the host got wrong (an unknown system call name...)
    end the call before any worker starts, with a 500 that says what is wrong."""
    try:
        return check_together(Limits.merged(base, override))
    except (ValueError, TypeError) as exc:
        raise CallFailed(f"[{library}] not run: host_tool_configs[{library!r}][\"sandbox\"] "
                         f"is invalid: {exc}") from None


def check_together(limits: Limits) -> Limits:
    """``limits``, if its settings make sense together (ValueError naming the one that
    does not)."""
    if limits.max_processes is not None and (limits.max_processes < 1 or not limits.confine):
        raise ValueError(f"'max_processes' is {limits.max_processes!r}: it caps a confined "
                         f"worker's processes (confine=True) and is at least 1")
    if limits.disk_mb is not None and (limits.disk_mb < MIN_DISK_MB or not limits.confine):
        raise ValueError(f"'disk_mb' is {limits.disk_mb!r}: it caps a confined worker's root "
                         f"(confine=True) and is at least {MIN_DISK_MB}")
    if isinstance(limits.network, dict) and not limits.confine:
        raise ValueError("'network' is a policy, which only a confined worker can be held "
                         "to (confine=True): unconfined, a tool reaches the network past "
                         "any proxy")
    return limits
