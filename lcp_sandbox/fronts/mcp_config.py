"""``serve-mcp --config FILE``: every session's ``host_tool_configs``, read and checked when
the server starts, before it listens.  A mistake in it is the command's (exit status 2, one
line naming it), not the first session's first call; the checks are a binding's own.

    read_configs(path)     the JSON file: {"host_tool_configs": {...}} or the dict itself; a
                           key given twice in an object (core/strict_json: JSON would keep
                           the last silently), a top-level key one slip from
                           "host_tool_configs", or another key beside it, is refused (taken
                           for a library's name, it would leave every protection of the
                           file out)
    check_configs(configs, folders, base)
        core/host_configs.check_entries   every entry a dict, each "sandbox" a dict, no key
                                          a slip of "sandbox"
        core/host_configs.check_names     against the libraries of the served folders: a
                                          "sandbox" under a slip of a library's name, or
                                          under a file of a folder library, is refused;
                                          other entries of no library are warnings
        a "sandbox" of no library         refused: an MCP client registers no code, so no
                                          library of that name comes later but a file put
                                          in a folder while the server runs (put it there
                                          first)
        core/limits (Limits.merged, check_together)
                                          each "sandbox" section over the sessions' own
                                          settings (--confine..., --network..., --timeout,
                                          --memory-mb): an unknown or misspelled setting, a
                                          wrong type, settings that do not hold together
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core import discovery, strict_json
from ..core.host_configs import check_entries, check_names, sandbox_section
from ..core.limits import Limits, check_together
from ..core.spelling import closest, near_miss

WRAPPER = "host_tool_configs"


class ConfigError(ValueError):
    """What is wrong with the file, in words that name it."""


def read_configs(path: str) -> dict[Any, Any]:
    """The ``host_tool_configs`` the JSON file ``path`` holds; ConfigError naming what is
    wrong (not readable, not JSON, not an object of objects, a slip of the wrapper key)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = strict_json.load(f)
    except OSError as exc:
        raise ConfigError(exc.strerror or str(exc)) from None
    except strict_json.DuplicateKey as exc:
        raise ConfigError(str(exc)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"must hold a JSON object of library names to objects "
                          f"({WRAPPER}), not {type(data).__name__}")
    if WRAPPER in data:
        beside = [k for k in data if k != WRAPPER]
        if beside:
            raise ConfigError(f"has {beside[0]!r} beside {WRAPPER!r}: give the "
                              f"{WRAPPER} alone, or the dict itself")
        data = data[WRAPPER]
    else:
        slips = [k for k in data if near_miss(k, [WRAPPER])]
        if slips:
            raise ConfigError(f"has {slips[0]!r}, which is not {WRAPPER!r}: read as a "
                              f"library's name, its settings would protect nothing")
    return _entries(data)


def _entries(configs: Any) -> dict[Any, Any]:
    try:
        check_entries(configs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    checked: dict[Any, Any] = configs
    return checked


def check_configs(configs: dict[Any, Any], folders: list[str], base: Limits) -> list[str]:
    """The warnings about ``configs`` (entries that name no library of ``folders``,
    settings beside "sandbox"); ConfigError for an entry a session's binding would refuse,
    or a "sandbox" section that would end every call of its library with a 500."""
    _entries(configs)
    libraries = list(discovery.iter_libraries([Path(f) for f in folders]))
    try:
        warnings, known = check_names(configs, libraries)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for key, entry in configs.items():
        section = sandbox_section(entry, key)
        if section is None:
            continue
        if key not in known:
            raise ConfigError(_of_no_library(key, sorted({lib.name for lib in libraries})))
        try:
            check_together(Limits.merged(base, section))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{WRAPPER}[{key!r}][\"sandbox\"] is invalid: {exc}") from None
    return warnings


def _of_no_library(key: Any, names: list[str]) -> str:
    meant = closest(key, names)
    hint = f" (did you mean {meant!r}?)" if meant is not None else ""
    shown = ", ".join(names[:40]) + (", ..." if len(names) > 40 else "")
    return (f"{WRAPPER}[{key!r}] has \"sandbox\" settings but names no library of the "
            f"served folders{hint}: they would protect nothing; the libraries: "
            f"{shown or 'none'}")
