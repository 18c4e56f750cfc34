"""Message kinds, message types, caps and the protocol's constants (see the package docstring)."""
from __future__ import annotations

import signal
import struct
from enum import IntEnum
from typing import Any, NamedTuple, Optional

# ---------------------------------------------------------------- constants
# The worker turns it into ToolTimeout inside the tool (Windows has no SIGUSR1: a spawned
# worker there raises its handler itself, see worker/spawned.py).
SOFT_TIMEOUT_SIGNAL = getattr(signal, "SIGUSR1", signal.SIGTERM)
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
# Host -> a worker forked ahead, before its INIT (backends/local/zygote_client.py):
PRIME = 11


class Init(NamedTuple):
    library: str
    files: list[str]          # absolute paths, in load order (empty: code registered at run time)
    source: Optional[str]     # code of a library registered with register_tool_from_code
    configs: dict[str, Any]   # host_tool_configs of the library's stems (host callables as refs)
    handlers: int             # HANDLER_* bits
    sys_path: Optional[list[str]]
    # the whole environment (unconfined) or the allowlisted part (confined), bytes
    env: Optional[dict[bytes, bytes]]
    confine: Optional[dict[str, Any]]   # {"root", "read_paths"} when confined
    tmpdir: Optional[str]     # the private temp dir the host made for a confined worker
    disabled: list[str]       # protections switched off for a test (lcp_sandbox.testing)
    limits: dict[str, Any]    # Limits as a dict
    # the library's own environment: {"requirements", "where"} as declared; once the host
    # has it built, also {"key", "prefix", "site", "versions"} (worker/environment.py)
    environment: Optional[dict[str, Any]] = None


class Prime(NamedTuple):
    """What every unconfined worker of this host gets, set while the worker waits for
    its INIT; INIT's own values are set again over it (then nothing differs)."""
    env: dict[bytes, bytes]   # the host's environment
    sys_path: list[str]


class Call(NamedTuple):
    tool: str
    file_index: int
    params: dict[str, Any]
    cwd: str
    injected: Optional[dict[str, Any]]  # host objects, lent as refs
    handlers: int
    spin_us: int = 0          # after its RESULT, the worker polls this long for the next CALL


class Prompt(NamedTuple):
    fn: str
    file_index: int
    cwd: str
    handlers: int


class ModCall(NamedTuple):
    fn: str
    file_index: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
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
    args: list[Any]
    kwargs: dict[str, Any]


class Reply(NamedTuple):
    ok: bool
    value: Any                # the value, or [type name, args] of the error


class Ready(NamedTuple):
    report: dict[str, str]    # what protections are in force


class Outcome(IntEnum):
    """How a call ended: a RESULT's ``outcome``, an int on the wire (the plain ints
    below).  The host reads what a worker sent as an Outcome
    (Supervisor._outcome, backends/local/supervisor.py)."""
    OK = 0                    # the value is the answer (an LCP result for a CALL)
    TIMED_OUT = 1             # the tool obeyed the soft timeout (or an interrupt)
    OUT_OF_MEMORY = 2         # MemoryError escaped the tool; the detail is its message
    LOAD_FAILED = 3           # the library did not load: the worker exits after this RESULT
    RAISED = 4                # a module function raised: the value is [type name, args]


# The same values as plain ints, as they travel: what a worker sends, what the codec
# checks and the warm path compares.  On every call an int is faster than an IntEnum
# member: msgpack packs it on the encoder's fast path (a member: twice the cost), and
# it compares with an int without a detour (the codec's check: +5% with members).
OK, TIMED_OUT, OUT_OF_MEMORY, LOAD_FAILED, RAISED = (int(o) for o in Outcome)


class Result(NamedTuple):
    value: Any
    outcome: int              # an Outcome, as its int
    detail: str

HOST_TO_WORKER = {INIT: Init, CALL: Call, PROMPT: Prompt, MODCALL: ModCall, LOAD: Load,
                  SHUTDOWN: Shutdown, REQUEST: Request, REPLY: Reply, PRIME: Prime}
#: The kind each message type the host sends goes with: HOST_TO_WORKER read the other way.
KIND_OF = {cls: kind for kind, cls in HOST_TO_WORKER.items()}

# REQUEST ops
OP_CALL = 0       # ref(*args, **kwargs)
OP_GETATTR = 1    # getattr(ref, name), public names only
OP_METHOD = 2     # getattr(ref, name)(*args, **kwargs), public names only
OP_SETATTR = 3    # setattr(ref, name, args[0]), public names only
OP_TRUTH = 4      # bool(ref)
OP_LIST = 5       # list(ref)
OP_OPERATOR = 6   # one of binding/objects.py OPERATORS by name: ==, <, hash(), len(), in...
OPS = frozenset(range(7))


class BadMessage(Exception):
    """A worker sent something the protocol does not allow; it is killed, not believed."""


class PayloadError(Exception):
    """A message could not be turned into bytes (it cannot be pickled, or it is too big)."""


#: A frame's header: 4-byte big-endian payload length, then the kind.
HEADER = struct.Struct("!IB")
