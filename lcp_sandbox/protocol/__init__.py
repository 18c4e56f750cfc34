"""The protocol between the host and its workers: messages, codecs, framing.

The one package both sides share, and the only one that knows bytes:
``messages`` (kinds, message types, caps), ``codec`` (the two codecs and the
checks of what a worker sends), ``framing`` (frames on a socket; ``portable_framing``:
the same frames with only what every OS has, for spawned workers), ``values``
(how plain values and exceptions travel), ``control`` (the zygote's own
records) and ``dialer`` (what a worker's dialer to the egress proxy carries).
Everything but ``control`` and ``dialer`` is re-exported here: ``P.Call``,
``P.Connection``...

    host ──PRIME (a worker forked ahead: environment) ─► worker   0..1, unconfined only
    host ──INIT (once; the library's files compiled) ─► worker
    host ◄─READY (what protections are in force) ────── worker   first message, exactly once
    host ──CALL | PROMPT | MODCALL | LOAD ────────────► worker   one call at a time
    host ◄─REQUEST (a handler, a lent host object) ──── worker   0..n while the call runs
    host ──REPLY ──────────────────────────────────────► worker
    host ──REQUEST (a callable the tool lent) ─────────► worker   0..n inside a REQUEST
    host ◄─REPLY ────────────────────────────────────── worker
    host ◄─RESULT ───────────────────────────────────── worker   ends the call
    host ──SHUTDOWN ───────────────────────────────────► worker

A frame is a 4-byte big-endian payload length, one byte of kind, the payload.
The kind comes before the payload so the host can check the length against
that kind's cap before it allocates anything.

The two directions are not equally trusted, so they use two codecs:

* host → worker: ``pickle`` (the host is trusted; config values and lent
  references cross as they are).
* worker → host: msgpack, decoded into plain types only: None, bool, int,
  float, str, bytes, list, dict, and through extension types built by
  :class:`Decoder` alone, tuple, set, frozenset, bytearray, complex, big
  ints, datetime / date / time / timedelta, Decimal, UUID, PosixPath and
  references to host objects.  No decoder in the host can construct any
  other object or run any code of the worker's choosing.  Map keys are
  str or bytes natively (their hashes are randomized); keys of other types,
  and set members that are not str or bytes, are limited to
  ``MAX_HASHED`` per message, so a worker cannot stall the host with keys
  that all collide in one hash bucket.

The worker turns anything else a tool returns into something plain before
sending (see :class:`Encoder`).  Exceptions cross as (type name, args).
"""
from .codec import *  # noqa: F401,F403
from .framing import *  # noqa: F401,F403
from .messages import *  # noqa: F401,F403
from .portable_framing import BOOTED as BOOTED
from .portable_framing import PortableConnection as PortableConnection
from .portable_framing import portable_pair as portable_pair
from .values import *  # noqa: F401,F403
