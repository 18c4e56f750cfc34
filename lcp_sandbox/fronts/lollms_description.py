"""lollms' description.yaml of the "sandboxed" binding: what its forms need, and the writer.

    fronts/settings_table.py   keywords, defaults, descriptions (the settings table's source)
          │   lollms_parameters(), lollms_commands()
          ▼
    render(parameters, commands) ──► lcp_sandbox/lollms_bindings/sandboxed/description.yaml
                                     (LollmsTOOLBindingManager.get_binding_description, forms)

What lollms' forms need beyond the settings table is here: the form type of each keyword,
closed choices, the settings lollms passes that reach the binding through ``**kwargs``, and
what each parameter of the binding's commands is.  The file is written by
``python -m lcp_sandbox.fronts.settings_table --write``; tests/fronts/test_lollms_surface.py fails
when it is not that output.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Where lollms reads the binding's description.
PATH = Path(__file__).resolve().parent.parent / "lollms_bindings" / "sandboxed" / "description.yaml"

#: The head of description.yaml (who the binding is, for lollms' lists).
HEAD: dict[str, str] = {
    "name": "sandboxed", "binding_name": "SandboxedBinding", "author": "lcp_sandbox",
    "description": "LCP tools, each library in its own isolated, long-lived worker process "
    "(lcp_sandbox).", "version": "0.1", "icon": "🛡️"}

#: The type a lollms settings form gives each ``SandboxedBinding`` keyword, in lollms' words
#: (str, int, float, bool, list, dict); ``callable`` and ``object`` are set by a host in code.
#: A setting that takes more than one kind has its main one here; its description says the rest.
TYPES: dict[str, str] = {
    "host_tool_configs": "dict", "tools_folders": "list", "tool_files": "list",
    "confirm_handler": "callable", "user_interaction_handler": "callable", "workspace": "str",
    "tenant": "str", "timeout_s": "float", "memory_mb": "float", "supervisor": "object",
    "confine": "bool", "workspace_root": "str", "network": "bool", "secrets": "dict"}

#: The closed choices of a keyword, for a form's select.
OPTIONS: dict[str, list[Any]] = {"confine": [True, False, "best-effort"]}

#: Settings lollms passes that reach ``SandboxedBinding`` through ``**kwargs``, as
#: ``LCPBinding``'s description declares them: (type, default, description).
KWARGS: dict[str, tuple[str, Any, str]] = {
    "tools_folder_path": ("str", None, "one folder of libraries: the older name of "
                          "`tools_folders`, used when `tools_folders` is not given"),
    "enable_auto_model_selection": ("bool", False, "a load flag: `True` loads lollms_client's "
                                    "`models_tools` library (list and switch models, child "
                                    "agents), which declares it as its "
                                    "`TOOL_LIBRARY_LOAD_FLAG`"),
}

#: The binding's lollms commands (methods a settings page runs by name): what each of their
#: parameters is.  The command's own description is its method's docstring.
COMMANDS: dict[str, dict[str, str]] = {
    "cleanup": {"status": "the text the command answers with (empty: a summary of what it "
                "removed)"},
}

#: The form type of a command parameter's annotation.
ANNOTATION_TYPES = {"str": "str", "int": "int", "float": "float", "bool": "bool"}


def render(parameters: list[dict[str, Any]], commands: dict[str, dict[str, Any]],
           command: str) -> str:
    """description.yaml's text (``command``: what makes it, named in its first line)."""
    lines = [f"# Made by `{command}` (lcp_sandbox/fronts/settings_table.py); do not edit by hand.",
             *(f"{k}: {_yaml(v)}" for k, v in HEAD.items()), "commands:"]
    for name, spec in commands.items():
        lines += [f"  {name}:", f"    function_name: {spec['function_name']}",
                  f"    description: {_yaml(spec['description'])}", "    parameters:"]
        lines += _entries(spec["parameters"], "      ")
    lines.append("global_input_parameters:")
    lines += _entries(parameters, "  ")
    lines.append("model_input_parameters: []")
    return "\n".join(lines) + "\n"


def _yaml(value: Any) -> str:
    """A YAML scalar or flow list (JSON is YAML)."""
    return json.dumps(value, ensure_ascii=False)


def _entries(entries: list[dict[str, Any]], indent: str) -> list[str]:
    lines = []
    for entry in entries:
        first, *rest = entry.items()
        lines.append(f"{indent}- {first[0]}: {_yaml(first[1])}")
        lines += [f"{indent}  {k}: {_yaml(v)}" for k, v in rest]
    return lines


def write(text: str, path: Path = PATH) -> None:
    path.write_text(text, encoding="utf-8")
    print(f"wrote the lollms settings into {path}")
