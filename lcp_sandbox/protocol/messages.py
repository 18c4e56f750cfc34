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
# Handler bits: which host handlers are set.
HANDLER_CONFIRM = 1
HANDLER_UI = 2
# Parameters the host injects (never LLM-facing, never in a schema).
HOST_PARAMS = frozenset({"tool_context", "lollms_client_instance", "discussion_instance",
                         "user_interaction_handler"})
# Named host objects a worker may refer to (besides per-call integer refs):
# The confirm handler, when one is set.
REF_CONFIRM = "confirm"
# The user-interaction handler, when one is set.
REF_UI = "ui"
# and ["cfg", stem, key]: a callable in host_tool_configs[stem][key] of the library's own stems.

# Frame caps (bytes) for what a worker sends; RESULT's is the library's max_result_mb + overhead.
READY_CAP = 64 * 1024
# REQUEST and REPLY from a worker.
REQUEST_CAP = 16 * 1024 * 1024
RESULT_OVERHEAD = 64 * 1024
# Non-str keys and set members per message.
MAX_HASHED = 4096
# Nesting of what a worker sends.
MAX_DEPTH = 256


# ---------------------------------------------------------------- messages
# Kinds.  Host -> worker:
INIT, CALL, PROMPT, MODCALL, LOAD, SHUTDOWN = 1, 2, 3, 4, 5, 6
# Either way (a REQUEST's answer; host -> worker REQUEST calls a callable the tool lent):
REQUEST, REPLY = 7, 8
# Worker -> host:
READY, RESULT = 9, 10
# Host -> a worker forked ahead, before its INIT (backends/local/zygote_client.py):
PRIME = 11


class Compiled(NamedTuple):
    """A library file as the host compiled it (core/code_cache.py), for a worker that
    would otherwise compile it again: of the file's version (mtime, size, inode) and
    of an interpreter whose bytecode has ``magic``."""
    magic: bytes
    mtime_ns: int
    size: int
    inode: int
    # marshal.dumps of the module's code object
    code: bytes


class Init(NamedTuple):
    library: str
    # Absolute paths, in load order (empty: code registered at run time)
    files: list[str]
    # Code of a library registered with register_tool_from_code.
    source: Optional[str]
    # host_tool_configs of the library's stems (host callables as refs)
    configs: dict[str, Any]
    # HANDLER_* bits.
    handlers: int
    sys_path: Optional[list[str]]
    # the whole environment (unconfined) or the allowlisted part (confined), bytes
    env: Optional[dict[bytes, bytes]]
    # {"root", "read_paths"} when confined.
    confine: Optional[dict[str, Any]]
    # The private temp dir the host made for a confined worker.
    tmpdir: Optional[str]
    # Protections switched off for a test (lcp_sandbox.testing)
    disabled: list[str]
    # Limits as a dict.
    limits: dict[str, Any]
    # the library's own environment: {"requirements", "where"} as declared; once the host
    # has it built, also {"key", "prefix", "site", "versions"} (worker/environment.py)
    environment: Optional[dict[str, Any]] = None
    # ``files`` as the host compiled them, in their order (None: the worker compiles)
    code: Optional[list[Optional[Compiled]]] = None


class Prime(NamedTuple):
    """What every unconfined worker of this host gets, set while the worker waits for
    its INIT; INIT's own values are set again over it (then nothing differs)."""
    # The host's environment.
    env: dict[bytes, bytes]
    sys_path: list[str]


class Call(NamedTuple):
    tool: str
    file_index: int
    params: dict[str, Any]
    cwd: str
    # Host objects, lent as refs.
    injected: Optional[dict[str, Any]]
    handlers: int
    # After its RESULT, the worker polls this long for the next CALL.
    spin_us: int = 0


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
    # Int (lent this call), REF_CONFIRM / REF_UI, or ["cfg", stem, key].
    ref: Any
    # Attribute or operator name.
    name: Optional[str]
    args: list[Any]
    kwargs: dict[str, Any]


class Reply(NamedTuple):
    ok: bool
    # The value, or [type name, args] of the error.
    value: Any


class Ready(NamedTuple):
    # What protections are in force.
    report: dict[str, str]


class Outcome(IntEnum):
    """How a call ended: a RESULT's ``outcome``, an int on the wire (the plain ints
    below).  The host reads what a worker sent as an Outcome
    (Supervisor._outcome, backends/local/supervisor.py)."""
    # The value is the answer (an LCP result for a CALL)
    OK = 0
    # The tool obeyed the soft timeout (or an interrupt)
    TIMED_OUT = 1
    # MemoryError escaped the tool; the detail is its message.
    OUT_OF_MEMORY = 2
    # The library did not load: the worker exits after this RESULT.
    LOAD_FAILED = 3
    # A module function raised: the value is [type name, args].
    RAISED = 4


# The same values as plain ints, as they travel: what a worker sends, what the codec
# checks and the warm path compares.  On every call an int is faster than an IntEnum
# member: msgpack packs it on the encoder's fast path (a member: twice the cost), and
# it compares with an int without a detour (the codec's check: +5% with members).
OK, TIMED_OUT, OUT_OF_MEMORY, LOAD_FAILED, RAISED = (int(o) for o in Outcome)


class Result(NamedTuple):
    value: Any
    # An Outcome, as its int.
    outcome: int
    detail: str

HOST_TO_WORKER = {INIT: Init, CALL: Call, PROMPT: Prompt, MODCALL: ModCall, LOAD: Load,
                  SHUTDOWN: Shutdown, REQUEST: Request, REPLY: Reply, PRIME: Prime}
#: The kind each message type the host sends goes with: HOST_TO_WORKER read the other way.
KIND_OF = {cls: kind for kind, cls in HOST_TO_WORKER.items()}

# REQUEST ops
# ref(*args, **kwargs)
OP_CALL = 0
# getattr(ref, name), public names only.
OP_GETATTR = 1
# getattr(ref, name)(*args, **kwargs), public names only.
OP_METHOD = 2
# setattr(ref, name, args[0]), public names only.
OP_SETATTR = 3
# bool(ref)
OP_TRUTH = 4
# list(ref)
OP_LIST = 5
# One of binding/objects.py OPERATORS by name: ==, <, hash(), len(), in...
OP_OPERATOR = 6
OPS = frozenset(range(7))


class BadMessage(Exception):
    """A worker sent something the protocol does not allow; it is killed, not believed."""


class PayloadError(Exception):
    """A message could not be turned into bytes (it cannot be pickled, or it is too big)."""


#: A frame's header: 4-byte big-endian payload length, then the kind.
HEADER = struct.Struct("!IB")
