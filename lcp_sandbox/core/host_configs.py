"""``host_tool_configs`` checked: what each entry is, its ``"sandbox"`` section, whose it is.

    {library or file stem: {the library's own settings, "sandbox": {sandbox settings}}}

    check_entries(configs)             every entry a dict; each "sandbox" a dict; no key a
                                       slip of "sandbox" ("Sandbox", "sandbox ", "sand_box"):
                                       TypeError/ValueError naming it
    check_names(configs, libraries)    whose each entry is, against the libraries the binding
                                       can reach: an entry of no library (nor file of one)
                                       holding "sandbox" is an error (its protections would
                                       hold nowhere), and so is "sandbox" under a file of a
                                       folder library (that library's is under its folder's
                                       name); other entries of no library come back as
                                       warnings naming the libraries there are
    config_limits(base, entry, name)   a library's limits from its whole entry, checked as
                                       above at each library's first call (the dict is live:
                                       a host may change it after construction)
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


def check_names(configs: dict[Any, Any], libraries: Iterable[Library]) -> list[str]:
    """The warnings about entries that name no library of ``libraries``, or hold sandbox
    settings beside ``"sandbox"``; ValueError for an entry whose ``"sandbox"`` section
    would hold nowhere."""
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
        text = _names_no_library(key, sorted(names))
        if SANDBOX in entry:
            raise ValueError(f"{text}: its {SANDBOX!r} settings would protect nothing. A library "
                             f"that comes later (register_tool_from_code, a file written "
                             f"after the binding was made) gets its entry when it comes: "
                             f"binding.host_tool_configs is read at each library's first call")
        warnings.append(f"{text}: the entry is kept, and used if such a library comes")
    return warnings


def _misplaced(key: Any, entry: dict[Any, Any]) -> str:
    found = sorted(k for k in entry if k in Limits.__dataclass_fields__)
    return (f"host_tool_configs[{key!r}] has {', '.join(map(repr, found))} beside "
            f"{SANDBOX!r}, not in it: the library gets them as its own settings, the sandbox "
            f"takes its settings from host_tool_configs[{key!r}][{SANDBOX!r}] only")


def _names_no_library(key: Any, names: list[str]) -> str:
    stem = key[:-3] if isinstance(key, str) and key.endswith(".py") else key
    meant = stem if stem in names else closest(stem, names)
    hint = f" (did you mean {meant!r}?)" if meant is not None else ""
    shown = ", ".join(names[:40]) + (", ..." if len(names) > 40 else "")
    return (f"host_tool_configs[{key!r}] names no library of this binding{hint}; its "
            f"libraries: {shown or 'none'}")


def _file_not_library(stem: str, library: str) -> str:
    return (f"host_tool_configs[{stem!r}] has {SANDBOX!r}, but {stem!r} is a file of the "
            f"folder library {library!r}, whose workers follow "
            f"host_tool_configs[{library!r}][{SANDBOX!r}]: put the settings there")


def config_limits(base: Limits, entry: Any, library: str) -> Limits:
    """The limits of ``library`` from its entry of ``host_tool_configs`` (None: none); an
    entry that is wrong ends the call before any worker starts, with a 500 naming it."""
    if entry is None:
        return library_limits(base, None, library)
    try:
        section = sandbox_section(entry, library)
    except (TypeError, ValueError) as exc:
        raise CallFailed(f"[{library}] not run: {exc}") from None
    return library_limits(base, section, library)
