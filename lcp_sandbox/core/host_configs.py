"""``host_tool_configs`` checked: what each entry is, its ``"sandbox"`` section, whose it is.

    {library or file stem: {the library's own settings, "sandbox": {sandbox settings}}}

    check_entries(configs)             every entry a dict; each "sandbox" a dict; no key a
                                       slip of "sandbox" ("Sandbox", "sandbox ", "sand_box"):
                                       TypeError/ValueError naming it
    check_names(configs, libraries)    whose each entry is, against the libraries the binding
                                       can reach: "sandbox" under a slip of a library's name
                                       ("rt-set", "rt_set.py" for rt_set) or under a file of
                                       a folder library (whose workers follow the folder's
                                       entry) is an error; other entries of no library are
                                       warnings naming the libraries there are (one holding
                                       "sandbox" waits for a library of that name that comes
                                       later: register_tool_from_code); sandbox settings
                                       beside "sandbox" are warnings too
    config_limits(base, configs, name, known)
                                       a library's limits, checked as above at each library's
                                       first call (the dict is live: a host may change it
                                       after construction, and libraries come later too)
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from .discovery import Library
from .limits import Limits, library_limits
from .outcomes import CallFailed
from .spelling import closest, near_miss

SANDBOX = "sandbox"


def sandbox_section(entry: Any, key: Any) -> Optional[dict[str, Any]]:
    """The ``"sandbox"`` dict of the entry ``host_tool_configs[key]`` (None without one);
    TypeError/ValueError naming what is wrong."""
    if not isinstance(entry, dict):
        raise TypeError(f"host_tool_configs[{key!r}] must be a dict (the library's settings), "
                        f"not {entry!r} ({type(entry).__name__})")
    slips = [k for k in entry if near_miss(k, [SANDBOX])]
    if slips:
        raise ValueError(f"host_tool_configs[{key!r}] has {slips[0]!r}, which is not "
                         f"{SANDBOX!r}: its settings would protect nothing (spell it "
                         f"{SANDBOX!r})")
    if SANDBOX not in entry:
        return None
    section = entry[SANDBOX]
    if not isinstance(section, dict):
        raise TypeError(f"host_tool_configs[{key!r}][{SANDBOX!r}] must be a dict of sandbox "
                        f"settings, not {section!r} ({type(section).__name__})")
    return section


def check_entries(configs: Any) -> None:
    """``configs`` is a dict of dicts whose ``"sandbox"`` sections are dicts, with no slip
    of ``"sandbox"`` (TypeError/ValueError naming the entry)."""
    if not isinstance(configs, dict):
        raise TypeError(f"host_tool_configs must be a dict of library names to their settings, "
                        f"not {configs!r} ({type(configs).__name__})")
    for key, entry in configs.items():
        sandbox_section(entry, key)


def check_names(configs: dict[Any, Any], libraries: Iterable[Library]) -> tuple[list[str],
                                                                               set[str]]:
    """(the warnings about entries that name no library of ``libraries`` or hold sandbox
    settings beside ``"sandbox"``, the names of those libraries and of their files);
    ValueError for a ``"sandbox"`` section that would hold nowhere, or under a slip of a
    library's name."""
    libs = list(libraries)
    names = {lib.name for lib in libs}
    folder_of = {f.stem: lib.name for lib in libs for f in lib.files if f.stem != lib.name}
    warnings = [_misplaced(key, entry) for key, entry in configs.items()
                if not set(entry).isdisjoint(Limits.__dataclass_fields__)]
    for key, entry in configs.items():
        if key in names:
            continue
        if key in folder_of:
            if SANDBOX in entry:
                raise ValueError(_file_not_library(key, folder_of[key]))
            continue
        meant = slip_of(key, {*names, *folder_of})
        text = _names_no_library(key, sorted(names), meant)
        if SANDBOX not in entry:
            warnings.append(f"{text}: the entry is kept, for a library of that name that "
                            f"comes later")
        elif meant is not None:
            raise ValueError(f"{text}: its {SANDBOX!r} settings would protect nothing")
        else:
            warnings.append(f"{text}: its {SANDBOX!r} settings will hold for a library of "
                            f"that name that comes later (register_tool_from_code), and for "
                            f"nothing else")
    return warnings, {*names, *folder_of}


def slip_of(key: Any, names: Iterable[str]) -> Optional[str]:
    """The name of ``names`` that ``key`` is a slip of (core/spelling.py), its ``.py`` file
    name included; None if none."""
    known = list(names)
    stem = key[:-3] if isinstance(key, str) and key.lower().endswith(".py") else key
    return stem if stem != key and stem in known else near_miss(stem, known)


def _misplaced(key: Any, entry: dict[Any, Any]) -> str:
    found = sorted(k for k in entry if k in Limits.__dataclass_fields__)
    return (f"host_tool_configs[{key!r}] has {', '.join(map(repr, found))} beside "
            f"{SANDBOX!r}, not in it: the library gets them as its own settings, the sandbox "
            f"takes its settings from host_tool_configs[{key!r}][{SANDBOX!r}] only")


def _names_no_library(key: Any, names: list[str], meant: Optional[str]) -> str:
    meant = meant or closest(key, names)
    hint = f" (did you mean {meant!r}?)" if meant is not None else ""
    shown = ", ".join(names[:40]) + (", ..." if len(names) > 40 else "")
    return (f"host_tool_configs[{key!r}] names no library of this binding{hint}; its "
            f"libraries: {shown or 'none'}")


def _file_not_library(stem: str, library: str) -> str:
    return (f"host_tool_configs[{stem!r}] has {SANDBOX!r}, but {stem!r} is a file of the "
            f"folder library {library!r}, whose workers follow "
            f"host_tool_configs[{library!r}][{SANDBOX!r}]: put the settings there")


def config_limits(base: Limits, configs: dict[Any, Any], library: str,
                  known: Iterable[str] = ()) -> Limits:
    """The limits of ``library`` from ``host_tool_configs`` as it is now; an entry that is
    wrong, or (when the library's own entry has no "sandbox") a "sandbox" under a slip of
    its name that names none of the ``known`` libraries, ends the call before any worker
    starts, with a 500 naming it."""
    try:
        section = sandbox_section(configs[library], library) if library in configs else None
        if section is None:
            _no_slip_holds(configs, library, set(known))
    except (TypeError, ValueError) as exc:
        raise CallFailed(f"[{library}] not run: {exc}") from None
    return library_limits(base, section, library)


def _no_slip_holds(configs: dict[Any, Any], library: str, known: set[str]) -> None:
    for key, entry in configs.items():
        if (key not in known and isinstance(entry, dict) and SANDBOX in entry
                and slip_of(key, [library]) == library):
            raise ValueError(f"host_tool_configs[{key!r}] has {SANDBOX!r} settings and is one "
                             f"slip from this library's name: put them under "
                             f"host_tool_configs[{library!r}]")
