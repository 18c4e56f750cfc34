"""YAML read as lollms reads it (yaml.safe_load), but a mapping key given twice is refused.

PyYAML keeps the last of two equal keys, silently.  The engine reads no YAML; it writes
lollms' description.yaml (fronts/lollms_description.py), and the tests read it back with
this loader, so a key the writer gives twice fails them instead of reading as the last.
"""
from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError


class StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader whose mappings refuse a key given twice (naming it and both lines)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        # The mapping's own keys: a merge key's (<<) are there to be overridden.
        own = [k for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
        seen: dict = {}
        for key_node in own:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:
                # (an unhashable key: SafeLoader's own refusal says so)
                continue
            if first is not None:
                raise ConstructorError("while constructing a mapping", node.start_mark,
                                       f"found the key {key!r} twice (first at line "
                                       f"{first.line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def load(text: str) -> Any:
    """``text`` as yaml.safe_load reads it; ConstructorError for a key given twice."""
    return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 (a SafeLoader)
