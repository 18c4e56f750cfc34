"""Message kinds, message types, caps and the protocol's constants (see the package docstring)."""
from __future__ import annotations

import signal
import struct
from typing import Any, NamedTuple, Optional

# ---------------------------------------------------------------- constants
SOFT_TIMEOUT_SIGNAL = signal.SIGUSR1      # the worker turns it into ToolTimeout inside the tool
HANDLER_CONFIRM = 1                       # handler bits: which host handlers are set
HANDLER_UI = 2
# Parameters the host injects (never LLM-facing, never in a schema).
HOST_PARAMS = frozenset({"tool_context", "lollms_client_instance", "discussion_instance",
                         "user_interaction_handler"})
# Named host objects a worker may refer to (besides per-call integer refs):
REF_CONFIRM = "confirm"                   # the confirm handler, when one is set
REF_UI = "ui"                             # the user-interaction handler, when one is set
# and ["cfg", stem, key]: a callable in host_tool_configs[stem][key] of the library's own stems.

# Frame caps (bytes) for what a worker sends; RESULT's is the library's max_result_mb + overhead.
READY_CAP = 64 * 1024
REQUEST_CAP = 16 * 1024 * 1024            # REQUEST and REPLY from a worker
RESULT_OVERHEAD = 64 * 1024
MAX_HASHED = 4096                         # non-str keys and set members per message
MAX_DEPTH = 256                           # nesting of what a worker sends


# ---------------------------------------------------------------- messages
# Kinds.  Host -> worker:
INIT, CALL, PROMPT, MODCALL, LOAD, SHUTDOWN = 1, 2, 3, 4, 5, 6
# Either way (a REQUEST's answer; host -> worker REQUEST calls a callable the tool lent):
REQUEST, REPLY = 7, 8
# Worker -> host:
READY, RESULT = 9, 10
# Host -> a worker forked ahead, before its INIT (host/zygote.py):
PRIME = 11


class Init(NamedTuple):
    library: str
    files: list               # absolute paths, in load order (empty for code registered at run time)
    source: Optional[str]     # code of a library registered with register_tool_from_code
    configs: dict             # host_tool_configs of the library's stems (host callables as refs)
    handlers: int             # HANDLER_* bits
    sys_path: Optional[list]
    env: Optional[dict]       # the whole environment (unconfined) or the allowlisted part (confined), bytes
    confine: Optional[dict]   # {"root", "read_paths"} when confined
    tmpdir: Optional[str]     # the private temp dir the host made for a confined worker
    disabled: list            # protections switched off for a test (lcp_sandbox.testing)
    limits: dict              # Limits as a dict


class Prime(NamedTuple):
    """What every unconfined worker of this host gets, set while the worker waits for
    its INIT; INIT's own values are set again over it (then nothing differs)."""
    env: dict                 # the host's environment, bytes
    sys_path: list


class Call(NamedTuple):
    tool: str
    file_index: int
    params: dict
    cwd: str
    injected: Optional[dict]  # host objects, lent as refs
    handlers: int
    spin_us: int = 0          # after its RESULT, the worker polls this long for the next CALL (host/spin.py)


class Prompt(NamedTuple):
    fn: str
    file_index: int
    cwd: str
    handlers: int


class ModCall(NamedTuple):
    fn: str
    file_index: int
    args: tuple
    kwargs: dict
    cwd: str
    handlers: int


class Load(NamedTuple):
    """Import every file of the library (and run init_tools_library); call no tool."""
    cwd: str
    handlers: int


class Shutdown(NamedTuple):
    pass


class Request(NamedTuple):
    op: int
    ref: Any                  # int (lent this call), REF_CONFIRM / REF_UI, or ["cfg", stem, key]
    name: Optional[str]       # attribute or operator name
    args: list
    kwargs: dict


class Reply(NamedTuple):
    ok: bool
    value: Any                # the value, or [type name, args] of the error


class Ready(NamedTuple):
    report: dict              # str -> str: what protections are in force


class Result(NamedTuple):
    value: Any
    outcome: int              # OUTCOME_*
    detail: str


# RESULT outcomes
OK, TIMED_OUT, OUT_OF_MEMORY, LOAD_FAILED, RAISED = 0, 1, 2, 3, 4

HOST_TO_WORKER = {INIT: Init, CALL: Call, PROMPT: Prompt, MODCALL: ModCall, LOAD: Load,
                  SHUTDOWN: Shutdown, REQUEST: Request, REPLY: Reply, PRIME: Prime}

# REQUEST ops
OP_CALL = 0       # ref(*args, **kwargs)
OP_GETATTR = 1    # getattr(ref, name), public names only
OP_METHOD = 2     # getattr(ref, name)(*args, **kwargs), public names only
OP_SETATTR = 3    # setattr(ref, name, args[0]), public names only
OP_TRUTH = 4      # bool(ref)
OP_LIST = 5       # list(ref)
OP_OPERATOR = 6   # one of host/objects.py OPERATORS by name: ==, <, hash(), len(), [], in, str()...
OPS = frozenset(range(7))


class ProtocolViolation(Exception):
    """A worker sent something the protocol does not allow; it is killed, not believed."""


class PayloadError(Exception):
    """A message could not be turned into bytes (it cannot be pickled, or it is too big)."""


#: A frame's header: 4-byte big-endian payload length, then the kind.
HEADER = struct.Struct("!IB")
