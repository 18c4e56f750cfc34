"""``serve-mcp --secret NAME=env:VAR`` and ``--secret NAME=file:PATH``: the values of the
secrets the server's egress proxy puts in its workers' requests (core/secrets.py), read when
the server starts.  A value is never on the command line (where ``ps`` shows it to every
user of the machine) and never in an error: a mistake names the secret and where it was to
come from.
"""
from __future__ import annotations

import os
from typing import Iterable

from ..core.secrets import host_secrets, settled

#: Bytes a secret's file may hold (a key, a token: not a document)
FILE_MAX = 64 * 1024


def secret_values(specs: Iterable[str]) -> dict[str, str]:
    """{name: value} of ``--secret`` arguments (ValueError naming the argument that is
    wrong, never a value)."""
    values: dict[str, str] = {}
    for spec in specs:
        name, sep, source = spec.partition("=")
        if not sep or not source.startswith(("env:", "file:")):
            raise ValueError(f"--secret {name or spec[:40]!r}: give NAME=env:VARIABLE or "
                             f"NAME=file:PATH (the value itself never goes on a command line)")
        if name in values:
            raise ValueError(f"--secret {name}: given twice")
        kind, _, where = source.partition(":")
        value = _from_env(name, where) if kind == "env" else _from_file(name, where)
        values.update(host_secrets({name: value}, f"--secret {name}"))
    return values


def unheld(configs: dict, values: dict[str, str]) -> None:
    """ValueError naming a secret a library's policy in ``configs`` (host_tool_configs, as
    --config gives them) binds, or its configs refer to, that ``values`` does not hold."""
    for library, entry in configs.items():
        if not isinstance(entry, dict):
            continue
        sandbox = entry.get("sandbox")
        network = sandbox.get("network") if isinstance(sandbox, dict) else None
        try:
            settled(network, entry, values, library, "give it with --secret NAME=env:VAR")
        except ValueError as exc:
            raise ValueError(f"--config: {exc}") from None


def _from_env(name: str, variable: str) -> str:
    value = os.environ.get(variable)
    if not value:
        raise ValueError(f"--secret {name}: the environment variable {variable!r} is not set "
                         f"or is empty")
    return value


def _from_file(name: str, path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(FILE_MAX + 1)
    except OSError as exc:
        raise ValueError(f"--secret {name}: {path!r} cannot be read ({exc.strerror})") from None
    if len(data) > FILE_MAX:
        raise ValueError(f"--secret {name}: {path!r} holds more than {FILE_MAX} bytes")
    try:
        # (one final line end, as an editor or `echo` leaves it, is not part of the value)
        return data.decode("utf-8").removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError:
        raise ValueError(f"--secret {name}: {path!r} is not UTF-8 text") from None
