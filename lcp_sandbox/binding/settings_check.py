"""SandboxedBinding's settings, checked when it is made (the rules: core/keywords.py,
core/host_configs.py; what a slip is: core/spelling.py).

    check_arguments(values, flags)     every keyword of the right kind; no load flag a slip
                                       of a setting; host_tool_configs a dict of dicts with
                                       "sandbox" sections spelled right and of the right kind
    check_entry_names(configs, catalog, files)
                                       whose each entry is, against every library the
                                       binding can reach now (its folders, its files and
                                       the folders the mount helpers search): warnings
                                       logged, a "sandbox" section of no library refused
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from ..core import discovery
from ..core.host_configs import check_entries, check_names
from ..core.keywords import check_load_flags, checked_keywords
from .tool_catalog import ToolCatalog

log = logging.getLogger("lcp_sandbox")


def check_arguments(values: Mapping[str, Any], flags: Mapping[str, Any]) -> None:
    """The constructor's keywords (``values``: its ``locals()``, ``flags``: its other
    keywords); TypeError/ValueError naming the first that is wrong."""
    checked_keywords("SandboxedBinding", {**values, **flags})
    check_load_flags(flags)
    configs = values.get("host_tool_configs")
    check_entries({} if configs is None else configs)


def check_entry_names(configs: dict, catalog: ToolCatalog, files: list[Path]) -> set[str]:
    """Log the entries of ``configs`` that name no library the binding can reach; ValueError
    for one whose "sandbox" section would hold nowhere.  Returns the names of the libraries
    (and their files) it can reach (none looked for without entries: nothing to check)."""
    if not configs:
        return set()
    reachable = discovery.iter_libraries(catalog.search_dirs(), files, catalog.cache)
    warnings, names = check_names(configs, reachable)
    for warning in warnings:
        log.warning("%s", warning)
    return names
