"""The table of every setting (docs/configuration.md), generated from the code.

    python -m lcp_sandbox.fronts.settings_table            # print the table (Markdown)
    python -m lcp_sandbox.fronts.settings_table --write    # put it into docs/configuration.md,
                                                           # and the binding's settings into
                                                           # lollms' description.yaml

What the settings are and their defaults come from the code: the signatures of
``SandboxedBinding``, ``Supervisor`` and ``RaySupervisor``, the fields of ``Limits`` (the
``"sandbox"`` keys, their kinds from ``core.limits._KINDS``) and the ``serve-mcp`` parser.
What each one does comes from ``DESCRIPTIONS`` below (keywords and ``"sandbox"`` keys) and
from each flag's own ``help``.  tests/settings/test_settings_table.py fails when a setting has no
description, when a description names a setting that is gone, or when the page's table is
not this module's output: a new setting is documented by adding its line here and running
the ``--write`` command above.  The same keywords, defaults and descriptions make lollms'
``lcp_sandbox/lollms_bindings/sandboxed/description.yaml`` (with what lollms' forms need
besides: fronts/lollms_description.py); tests/fronts/test_lollms_surface.py fails when that file
is not this output.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..backends.local.supervisor import Supervisor
from ..backends.ray.driver import RaySupervisor
from ..binding.binding import SandboxedBinding
from ..core.limits import _KINDS, Limits
from ..core.policy import ENGINE_DIR
from . import lollms_description as lollms

COMMAND = "python -m lcp_sandbox.fronts.settings_table --write"
PAGE = Path(ENGINE_DIR) / "docs" / "configuration.md"
BEGIN = f"<!-- settings table: made by `{COMMAND}`; do not edit by hand -->"
END = "<!-- end of settings table -->"

#: What each keyword and "sandbox" key does, by group (the group's title: its table row).
DESCRIPTIONS: dict[str, dict[str, str]] = {
    "SandboxedBinding": {
        "host_tool_configs": "`{library stem: dict}` as for `LCPBinding`: passed to the "
        "library's `init_tools_library` and to tools that read their host config; its "
        '`"sandbox"` entry sets that library\'s settings (the '
        '`host_tool_configs[library]["sandbox"]` keys)',
        "tools_folders": "a folder or a list of folders of libraries (each `X/` sub-folder "
        "and each loose `.py` file is one); `tools_folder_path=` is accepted too. Without it "
        "or `tool_files`: lollms_client's default tools if installed, else the bundled ones",
        "tool_files": "a `.py` file or a list of them, each loaded as a library of its own",
        "confirm_handler": "`handler(source, script_label, argv=None) -> (decision, reason)`, "
        "run in the host when a tool asks for a confirmation",
        "user_interaction_handler": "run in the host when a tool asks the user something",
        "workspace": "the tools' working directory during a call, resolved against the host's "
        "CWD; created by the first call that uses it. `None`: the host's CWD at each call",
        "tenant": "who the calls are for: workers are keyed by (tenant, library)",
        "timeout_s": "a call's timeout in seconds (`None` or 0: none); the library's "
        '`"sandbox"` `timeout_s` and `execute_tool(..., timeout_s=)` override it',
        "memory_mb": "memory limit of each worker (`RLIMIT_DATA` and the watchdog over its "
        "tree's USS); `None`: none",
        "supervisor": "a `Supervisor` or `RaySupervisor` shared with other bindings; `None`: "
        "one of the binding's own, closed with it",
        "confine": 'confine the workers: `True`, `False` or `"best-effort"`; `None`: the '
        "supervisor's `confine`",
        "workspace_root": "a call whose workspace is not inside this folder is refused with "
        "403; confined workers are confined to it",
        "network": "the network of its libraries: `True` (the host's), `False` (none: loopback "
        'only) or, for confined workers, a policy `{"allow": [rules], "deny": [rules]}` '
        "([Network by policy](network.md)); `None`: the supervisor's `network`",
        "secrets": '`{"NAME": "value"}` over the supervisor\'s: the egress proxy puts a value in '
        "the requests to the hosts a library's policy binds its name to; the worker holds a "
        "placeholder ([Secrets](network.md#secrets))",
        "kwargs": "load flags, as `LCPBinding`: a library declaring "
        '`TOOL_LIBRARY_LOAD_FLAG = "X"` loads only with `X=True` here or in its '
        "`host_tool_configs` entry",
    },
    "Supervisor": {
        "max_workers": "worker processes at most (`None`: no cap); a call that needs one "
        "more evicts an idle worker or waits in a fair queue",
        "max_workers_per_tenant": "worker processes of one tenant at most (`None`: no cap)",
        "idle_timeout_s": "stop a worker idle this long (also a template none of whose "
        "workers lived that long); `None`: never",
        "confine": 'the default of bindings that do not say: `True`, `False` or '
        '`"best-effort"`',
        "on_event": "called with a dict per lifecycle event (start, stop, evict, idle, crash, "
        "violation, timeout, interrupt, memory, quarantine); also logged on "
        "`lcp_sandbox.events`",
        "crash_policy": "when a crashing library is quarantined; `None`: `CrashPolicy()` (5 "
        "fresh workers dead in a row, or 50 deaths in 60 s: 5 s, doubling up to 300 s)",
        "watch_interval_s": "how often the watchdog samples the memory of a call that has a "
        "memory limit",
        "run_as": "`(uid, gid)` of the confined workers of a root host, or "
        '`"per-tenant"` (a uid of its own per tenant, from `uid_range`); `None`: '
        '`"per-tenant"` for a root host with a `tenants_root`, else `(65534, 65534)`',
        "tenants_root": "the folder holding every tenant's root: confined workers of roots "
        "beneath it start from confined templates; `per-tenant` uids are kept there",
        "start_method": '`"zygote"` (fork; Linux) or `"spawn"` (a fresh interpreter per '
        "worker); `None`: `LCP_SANDBOX_START_METHOD`, else zygote on Linux, spawn elsewhere",
        "uid_range": '`(first uid, count)` the `"per-tenant"` uids come from',
        "max_processes_per_tenant": "with a uid per tenant, the processes and threads of all "
        "of one tenant's workers together (`RLIMIT_NPROC` of its uid: beyond it `fork` fails "
        "with `EAGAIN` in the tool); `None`: no cap",
        "envs_dir": "the store of the libraries' own environments (`None`: "
        "`LCP_SANDBOX_ENVS_DIR`, else the user's cache folder)",
        "env_wait_s": "how long a call waits for its library's environment to be built "
        "(outside its timeout; then 503, the build goes on)",
        "network": "the default `network` of bindings that do not say: `True`, `False` or a "
        "policy ([Network by policy](network.md))",
        "secrets": '`{"NAME": "value"}`: what the egress proxy puts in the requests to the '
        "hosts a library's policy binds a name to; the workers hold placeholders "
        "([Secrets](network.md#secrets)); `set_secret()` changes one",
        "upstream_ca_file": "the CAs the egress proxy checks the servers of hosts a secret is "
        "bound to against; `None`: the system's trust store",
    },
    "RaySupervisor": {
        "address": "the Ray cluster: `None` joins the one Ray finds (`RAY_ADDRESS`, or `ray "
        "start` on this machine) or starts a local one; a string goes to `ray.init()`",
        "max_workers_per_node": "each node's `max_workers`",
        "max_workers_per_tenant": "each node's `max_workers_per_tenant`",
        "idle_timeout_s": "as `Supervisor`'s, on every node",
        "confine": "as `Supervisor`'s, on every node",
        "tenants_root": "as `Supervisor`'s, on every node (a folder every node mounts at "
        "the same path)",
        "uid_range": "as `Supervisor`'s, on every node (`None`: its default)",
        "envs_dir": "as `Supervisor`'s, on every node: each node builds the environments of "
        "the libraries it runs in its own store, this folder as that node sees it (`None`: "
        "the node's default)",
        "env_wait_s": "as `Supervisor`'s, on every node (`None`: its default)",
        "on_event": "as `Supervisor`'s; events carry `\"node\"` and come from a background "
        "thread",
        "secrets": "as `Supervisor`'s, on every node: each node's agent holds the values "
        "(sent by a call of their own once it is up, and at `set_secret()`), its egress proxy "
        "puts them in requests, no worker holds them ([Secrets](network.md#secrets))",
        "upstream_ca_file": "as `Supervisor`'s, on every node: the file is read here and its "
        "text sent to each node's agent (no shared path needed)",
    },
    "sandbox": {
        "timeout_s": "a call's timeout in seconds (`None` or 0: none)",
        "grace_s": "after a timeout's interrupt, how long the tool has to give control back "
        "before its process tree is killed",
        "memory_mb": "`RLIMIT_DATA` of the worker and the watchdog's limit on its tree's USS",
        "cpu_s": "`RLIMIT_CPU` of the worker (CPU seconds over its life)",
        "max_open_files": "`RLIMIT_NOFILE` of the worker",
        "max_file_size_mb": "`RLIMIT_FSIZE`: a bigger write raises `OSError`",
        "max_result_mb": "the largest result a worker may send",
        "log_bytes_per_s": "what the tools print, forwarded to logging at most this fast "
        "(256 KiB a second); the rest is counted",
        "confine": '`True`, `False` or `"best-effort"`; `None`: the binding\'s',
        "network": "`True`: the host's network; `False`: a network namespace of its own, "
        "loopback only (confined: no `AF_INET`, `AF_INET6` nor unix sockets either); "
        '`{"allow": [...], "deny": [...], "secrets": {...}}`: only the hosts the rules '
        "admit, through the host's egress proxy, which puts each secret in the requests to "
        "the hosts it is bound to (confined workers only: [Network by policy](network.md))",
        "env": "environment variables added to the worker's",
        "read_paths": "more paths a confined worker may read",
        "run_as": '`[uid, gid]` of a confined worker of a root host, or `"per-tenant"`; '
        "`None`: the supervisor's `run_as`",
        "template": "`False`: every worker imports the library itself (no shared template)",
        "trusted_import": "`False`: a confined worker never imports it in a template "
        "(it starts from the base and imports after its own confinement)",
        "max_processes": "processes and threads of a confined worker's tree: a pids cgroup of "
        "its own; it starts fresh",
        "requirements": "the library's dependencies given by the host (over what the library "
        "declares): its workers get an environment of their own, built from wheels by uv",
        "disk_mb": "MiB a confined worker's root may hold: a file system of its own (a root "
        "host with loop devices and mkfs.ext4); it starts fresh",
        "syscalls": "system calls a confined worker adds to the allowlist: "
        '`{"allow": [names], "allow_dangerous": false}`',
    },
}

#: The kind of "sandbox" keys that core.limits._KINDS does not list (checked by their own
#: functions there).
OTHER_KINDS = {"confine": 'bool or "best-effort", or None', "run_as": '[uid, gid] or '
               '"per-tenant", or None', "syscalls": "dict or None",
               "network": "bool or dict (a policy)"}

#: serve-mcp defaults that depend on the machine, as the table says them.
MACHINE_DEFAULTS = {"--max-sessions": "one per 32 MiB of memory, 16 to 4,096"}

_KIND_WORDS = {"number": "number", "int": "whole number", "bool": "bool",
               "env": "dict of str", "paths": "list of paths"}


class Missing(Exception):
    """A setting of the code without a description (or a description without a setting)."""


def _cell(text: str) -> str:
    """``text`` as a table cell: pipes escaped, and angle brackets outside code spans (a
    help text's ``<session id>`` is no HTML tag)."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;")
                    for i, p in enumerate(parts))


def _literal(value: Any) -> str:
    return f"`{value!r}`"


def _keywords(cls: type, group: str) -> Iterator[tuple[str, str, str]]:
    """(name, default, description) of each keyword of ``cls.__init__``."""
    described = DESCRIPTIONS[group]
    # Its own: SandboxedBinding also has a __new__.
    init = cls.__dict__["__init__"]
    params = [p for p in inspect.signature(init).parameters.values() if p.name != "self"]
    names = {p.name for p in params}
    gone = sorted(set(described) - names)
    if gone:
        raise Missing(f"{group}: described but no keyword of it any more: {', '.join(gone)}")
    for p in params:
        if p.name not in described:
            raise Missing(f"{group}: the keyword {p.name!r} has no description")
        if p.kind is p.VAR_KEYWORD:
            yield "`**kwargs`", "", described[p.name]
        else:
            default = "required" if p.default is p.empty else _literal(p.default)
            yield f"`{p.name}`", default, described[p.name]


def _sandbox_keys() -> Iterator[tuple[str, str, str]]:
    described = DESCRIPTIONS["sandbox"]
    fields = dataclasses.fields(Limits)
    gone = sorted(set(described) - {f.name for f in fields})
    if gone:
        raise Missing(f"sandbox: described but no setting any more: {', '.join(gone)}")
    for f in fields:
        if f.name not in described:
            raise Missing(f'sandbox: the setting {f.name!r} has no description')
        kind = _KINDS.get(f.name)
        if kind is None and f.name not in OTHER_KINDS:
            raise Missing(f"sandbox: the setting {f.name!r} has no kind (core.limits._KINDS, "
                          f"or OTHER_KINDS here)")
        words = OTHER_KINDS.get(f.name) or " or ".join(
            _KIND_WORDS.get(k, k) for k in (kind or "").split("|"))
        yield f"`{f.name}`", _field_default(f), f"*{words}*: {described[f.name]}"


def _field_default(f: "dataclasses.Field[Any]") -> str:
    if f.default is not dataclasses.MISSING:
        return _literal(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _literal(f.default_factory())
    return "required"


def serve_mcp_parser() -> argparse.ArgumentParser:
    from .cli import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve-mcp"]


#: A help text's own word on the default, at its end: "... (default: X)".
_DEFAULT_SAID = re.compile(r"\s*\(default: (.*)\)$")


def _flags() -> Iterator[tuple[str, str, str]]:
    for action in serve_mcp_parser()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        key = action.option_strings[-1] if action.option_strings else action.dest
        if not action.option_strings:
            names = f"{action.metavar or action.dest}..."
        elif action.nargs == 0:
            names = ", ".join(action.option_strings)
        elif action.choices:
            names = f"{key} {{{','.join(map(str, action.choices))}}}"
        else:
            names = f"{key} {' '.join(_metavars(action))}"
        help_text = action.help or ""
        said = _DEFAULT_SAID.search(help_text)
        if said:
            help_text = help_text[:said.start()]
        if not help_text.strip() or action.help == argparse.SUPPRESS:
            raise Missing(f"serve-mcp: the flag {key!r} has no help text (its description)")
        default = MACHINE_DEFAULTS.get(key) or (said.group(1) if said else _flag_default(action))
        # Plain text.
        yield f"`{names}`", default, help_text.strip().replace("*", "\\*")


def _metavars(action: argparse.Action) -> list[str]:
    """The names of a flag's values (several for nargs=N with a tuple metavar)."""
    meta = action.metavar or action.dest.upper()
    return list(meta) if isinstance(meta, tuple) else [meta]


def _flag_default(action: argparse.Action) -> str:
    if not action.option_strings:
        return "required"
    # store_true, store_const: a switch.
    if action.nargs == 0:
        return "-"
    if action.default in (None, [], ()):
        return "none"
    return f"`{action.default}`"


GROUPS: list[tuple[str, Callable[[], Iterator[tuple[str, str, str]]]]] = [
    ("`SandboxedBinding(...)` keywords", lambda: _keywords(SandboxedBinding, "SandboxedBinding")),
    ('`host_tool_configs[library]["sandbox"]` keys (per library; checked before any worker '
     "starts: an unknown key or a wrong type answers 500 naming it)", _sandbox_keys),
    ("`Supervisor(...)` keywords", lambda: _keywords(Supervisor, "Supervisor")),
    ("`RaySupervisor(...)` keywords (the `ray` extra)",
     lambda: _keywords(RaySupervisor, "RaySupervisor")),
    ("`lcp-sandbox serve-mcp` flags (`lcp-sandbox serve-mcp --help`)", _flags),
]


def render() -> str:
    """The table: one row per setting, a bold row per group."""
    lines = ["| setting | default | what it does |", "|---|---|---|"]
    for title, rows in GROUPS:
        lines.append(f"| **{_cell(title)}** | | |")
        lines += [f"| {_cell(a)} | {_cell(b)} | {_cell(c)} |" for a, b, c in rows()]
    return "\n".join(lines)


def page_table(text: str) -> Optional[str]:
    """The table as it stands in the page's text; None without its markers."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def write(page: Path = PAGE) -> None:
    text = page.read_text(encoding="utf-8")
    if page_table(text) is None:
        raise SystemExit(f"{page} has no settings-table markers ({BEGIN} ... {END})")
    before, rest = text.split(BEGIN, 1)
    page.write_text(f"{before}{BEGIN}\n{render()}\n{END}{rest.split(END, 1)[1]}",
                    encoding="utf-8")
    print(f"wrote the settings table into {page}")


# ---------------------------------------------------------------- lollms' description.yaml
_DOC_LINK = re.compile(r"\[([^\]]+)\]\(([\w./-]+\.md)(#[\w-]+)?\)")


def _plain(text: str) -> str:
    """A description of this module as a form shows it: the pages' links as paths."""
    return _DOC_LINK.sub(lambda m: f"{m.group(1)}, docs/{m.group(2)}", text)


def lollms_parameters() -> list[dict[str, Any]]:
    """description.yaml's ``global_input_parameters``: every keyword of ``SandboxedBinding``
    (its default from the signature, its text from DESCRIPTIONS, its form type from
    fronts/lollms_description.py), then the settings lollms passes through ``**kwargs``."""
    described = DESCRIPTIONS["SandboxedBinding"]
    init = SandboxedBinding.__dict__["__init__"]
    params = [p for p in inspect.signature(init).parameters.values()
              if p.name != "self" and p.kind is not p.VAR_KEYWORD]
    gone = sorted(set(lollms.TYPES) - {p.name for p in params})
    if gone:
        raise Missing(f"lollms: a form type but no keyword any more: {', '.join(gone)}")
    out = []
    for p in params:
        if p.name not in lollms.TYPES:
            raise Missing(f"lollms: the keyword {p.name!r} has no type for lollms' forms "
                          "(TYPES in fronts/lollms_description.py)")
        out.append(_parameter(p.name, lollms.TYPES[p.name], described[p.name], p.default))
    sandbox = next(e for e in out if e["name"] == "host_tool_configs")
    sandbox["description"] += ": " + ", ".join(f.name for f in dataclasses.fields(Limits)) + \
        " (docs/configuration.md)"
    for name, (kind, default, text) in lollms.KWARGS.items():
        out.append(_parameter(name, kind, text, default))
    return out


def _parameter(name: str, kind: str, text: str, default: Any) -> dict[str, Any]:
    entry = {"name": name, "type": kind, "description": _plain(text), "mandatory": False,
             "default": None if default is inspect.Parameter.empty else default}
    if name in lollms.OPTIONS:
        entry["options"] = lollms.OPTIONS[name]
    return entry


def lollms_commands() -> dict[str, dict[str, Any]]:
    """description.yaml's ``commands``, in the shape of ``LCPBinding``'s: each one's method
    on the binding, its description (the docstring's first paragraph) and parameters."""
    out = {}
    for name, described in lollms.COMMANDS.items():
        method = getattr(SandboxedBinding, name)
        text = inspect.getdoc(method)
        if not text:
            raise Missing(f"lollms: the command {name!r} has no docstring (its description)")
        params = []
        for p in list(inspect.signature(method).parameters.values())[1:]:
            kind = lollms.ANNOTATION_TYPES.get(str(p.annotation))
            if p.name not in described or kind is None:
                raise Missing(f"lollms: the parameter {p.name!r} of the command {name!r} has no "
                              "description (COMMANDS) or no type a form can give")
            params.append({"name": p.name, "type": kind, "description": described[p.name],
                           "default": None if p.default is p.empty else p.default})
        out[name] = {"function_name": name, "parameters": params,
                     "description": " ".join(text.split("\n\n")[0].split()).replace("``", "`")}
    return out


def render_lollms_description() -> str:
    """lollms' description.yaml of the binding (fronts/lollms_description.py writes it)."""
    return lollms.render(lollms_parameters(), lollms_commands(), COMMAND)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lcp_sandbox.fronts.settings_table",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"put it into {PAGE.name} (the "
                    "checkout's docs/), between its markers, and the binding's settings "
                    f"into lollms' {lollms.PATH.name}")
    return ap


def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        table = render()
        render_lollms_description()
    except Missing as exc:
        print(f"settings_table: {exc}: describe it (DESCRIPTIONS in {__file__}, or the flag's "
              f"help=), then run `{COMMAND}`", file=sys.stderr)
        return 1
    if args.write:
        write()
        lollms.write(render_lollms_description())
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
