"""
host_probe.py — test library: tools that use the host objects lent to them
(lollms_client_instance, discussion_instance, tool_context) and report, as
plain data, what they saw.  Used by tests/test_host_objects.py both through
SandboxedBinding (proxies) and through lollms_client's in-process LCPBinding
(the live objects), so every report must be computable in both worlds: it
never names a proxy class, only "object" for something that is not plain.
"""
import threading
import time
from pathlib import Path

TOOL_LIBRARY_NAME = "Host Probe"
TOOL_LIBRARY_DESC = "Exercises host objects lent to tools."

_KEPT = {}
_BACKGROUND = {}
_CONFIG = {}
_PLAIN = (bool, int, float, str, bytes, tuple, list, dict)


def _kind(value):
    if value is None:
        return "None"
    if type(value) in _PLAIN:
        return type(value).__name__
    return "object"


def _error(exc):
    return {"type": type(exc).__name__, "message": str(exc)}


def init_tools_library(config=None):
    _CONFIG.clear()
    _CONFIG.update(config or {})


def tool_config_objects(wait: float = 0.0):
    """Uses objects made by a callable of the host config (host_tool_configs['host_probe']['factory']).

    Args:
        wait (float): seconds to hold the first object before using it.
    """
    first = _CONFIG["factory"]()
    time.sleep(wait)
    first_value = first.value()
    second = _CONFIG["factory"]()
    return {"success": True, "output": {"first": first_value, "second": second.value(),
                                        "first_again": first.value()}}


def tool_client_values(lollms_client_instance=None):
    """Reads plain values of every kind, nested objects and containers from the client."""
    c = lollms_client_instance
    out = {
        "llm_is_none": c.llm is None,
        "tti_is_none": c.tti is None,
        "ttm_is_none": c.ttm is None,
        "llm_kind": _kind(c.llm),
        "model_name": c.llm.model_name,
        "name": c.name,
        "flag": c.flag,
        "ratio": c.ratio,
        "count": c.count,
        "nothing": c.nothing,
        "blob": c.get_blob(),
        "blob_kind": _kind(c.get_blob()),
        "tuple": c.get_tuple(),
        "tuple_kind": _kind(c.get_tuple()),
        "dict": c.get_dict(),
        "dict_kind": _kind(c.get_dict()),
        "list": c.get_list(),
        "generated": c.generate_text("tell me", n_predict=3),
        "switched": c.switch_model("fast"),
        "model_after_switch": c.llm.model_name,
    }
    thing = c.make_thing(5)
    out["thing_kind"] = _kind(thing)
    out["thing_size"] = thing.size()
    out["thing_label"] = thing.label
    out["thing_child_size"] = thing.child().size()
    mixed = c.get_mixed()
    out["mixed_kind"] = _kind(mixed)
    out["mixed_obj_size"] = mixed["obj"].size()
    out["mixed_n"] = mixed["n"]
    out["mixed_len"] = len(mixed)
    out["mixed_has_obj"] = "obj" in mixed
    out["things_sizes"] = [t.size() for t in c.things]
    out["things_len"] = len(c.things)
    out["empty_truth"] = bool(c.empty_box)
    out["full_truth"] = bool(c.full_box)
    c.counter = 41
    c.counter += 1
    out["counter"] = c.counter
    out["str_of_thing"] = str(thing)
    out["has_llm"] = hasattr(c, "llm")
    out["has_nope"] = hasattr(c, "nope")
    out["getattr_default"] = getattr(c, "nope", "fallback")
    return {"success": True, "output": out}


def tool_pass_back(lollms_client_instance=None):
    """Hands host objects (and proxies of them) back to host methods."""
    c = lollms_client_instance
    llm = c.llm
    return {"success": True, "output": {
        "same_llm": c.is_my_llm(llm),
        "same_llm_kw": c.is_my_llm(obj=llm),
        "thing_size_via_host": c.size_of(c.make_thing(7)),
        "same_llm_in_list": c.all_my_llm([llm, llm]),
    }}


def tool_callback_into_tool(lollms_client_instance=None):
    """Streams a generation through a callback that lives in the tool."""
    chunks = []

    def on_chunk(text, *args, **kwargs):
        chunks.append(text)
        return True

    full = lollms_client_instance.generate_text("stream me", streaming_callback=on_chunk)
    return {"success": True, "output": {"full": full, "chunks": chunks}}


def tool_host_error(kind: str, lollms_client_instance=None):
    """Calls a host method that raises; reports what the tool caught.

    Args:
        kind (str): which exception the host raises.
    """
    c = lollms_client_instance
    try:
        c.fail(kind)
    except Exception as exc:
        return {"success": True, "output": {
            **_error(exc),
            "is_value_error": isinstance(exc, ValueError),
            "is_lookup_error": isinstance(exc, LookupError),
            "is_runtime_error": isinstance(exc, RuntimeError),
        }}
    return {"success": False, "error": "the host did not raise"}


def tool_host_error_uncaught(kind: str, lollms_client_instance=None):
    """Lets the host's exception propagate out of the tool.

    Args:
        kind (str): which exception the host raises.
    """
    lollms_client_instance.fail(kind)
    return "unreachable"


def tool_missing_attribute(lollms_client_instance=None):
    """Reads an attribute the host object does not have."""
    try:
        lollms_client_instance.does_not_exist
    except AttributeError as exc:
        return {"success": True, "output": _error(exc)}
    return {"success": False, "error": "no AttributeError"}


def tool_keep(lollms_client_instance=None, discussion_instance=None, tool_context=None):
    """Keeps the lent objects (and objects obtained from them) beyond the call."""
    c = lollms_client_instance
    _KEPT["client"] = c
    _KEPT["llm"] = c.llm
    _KEPT["thing"] = c.make_thing(3)
    _KEPT["discussion"] = discussion_instance
    _KEPT["tool_context"] = tool_context
    return {"success": True, "output": _KEPT["thing"].size()}


def tool_use_kept(what: str):
    """Uses an object kept by tool_keep in an earlier call.

    Args:
        what (str): client | llm | thing | discussion | tool_context
    """
    obj = _KEPT[what]
    try:
        if what == "client":
            value = obj.generate_text("again")
        elif what == "llm":
            value = obj.model_name
        elif what == "thing":
            value = obj.size()
        elif what == "discussion":
            value = obj.id
        else:
            value = obj.emit_progress("late", {})
    except Exception as exc:
        return {"success": True, "output": {"raised": True, **_error(exc)}}
    return {"success": True, "output": {"raised": False, "value": value}}


def tool_background_start(delay: float, lollms_client_instance=None):
    """Starts a thread that uses the client after `delay` seconds (after the call ended).

    Args:
        delay (float): seconds to wait before using the client.
    """
    client = lollms_client_instance

    def later():
        time.sleep(delay)
        try:
            _BACKGROUND["value"] = client.generate_text("from a thread")
            _BACKGROUND["error"] = None
        except Exception as exc:
            _BACKGROUND["error"] = _error(exc)

    t = threading.Thread(target=later, daemon=True)
    _BACKGROUND["thread"] = t
    t.start()
    return "started"


def tool_background_result():
    """Joins the thread of tool_background_start and reports what it got."""
    _BACKGROUND["thread"].join(10)
    return {"success": True, "output": {"error": _BACKGROUND.get("error"),
                                        "value": _BACKGROUND.get("value")}}


def tool_stream(count: int, tool_context=None):
    """Emits `count` progress lines; after the first, waits for the host to acknowledge it.

    The host's progress callback writes 'ack_0' in the workspace when it receives
    line 0: if lines were only delivered when the tool returns, this tool would
    never see the acknowledgement.

    Args:
        count (int): number of lines.
    """
    tool_context.emit_progress("line 0", {"i": 0})
    deadline = time.monotonic() + 10
    while not Path("ack_0").exists():
        if time.monotonic() > deadline:
            return {"success": False, "error": "line 0 did not reach the host while the tool ran"}
        time.sleep(0.005)
    for i in range(1, count):
        tool_context.emit_progress(f"line {i}", {"i": i})
    return {"success": True, "output": f"emitted {count}"}


def tool_stream_threads(per_thread: int, threads: int = 2, tool_context=None):
    """Emits progress from several threads at once (as system_shell's stdout/stderr drains do).

    Args:
        per_thread (int): lines per thread.
        threads (int): number of threads.
    """
    errors = []

    def run(name):
        try:
            for i in range(per_thread):
                ok = tool_context.emit_progress(f"{name} {i}", {"stream": name, "i": i})
                if ok is not True:
                    errors.append(f"{name} {i}: emit_progress returned {ok!r}")
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=run, args=(f"t{k}",)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    if errors:
        return {"success": False, "error": "; ".join(errors[:5])}
    return {"success": True, "output": per_thread * threads}


def tool_context_shape(tool_context=None):
    """Reports how each entry of a dict tool_context arrived, and uses the non-plain ones."""
    ctx = tool_context
    out = {"ctx_kind": _kind(ctx),
           "kinds": {k: _kind(v) for k, v in sorted(ctx.items())}}
    out["workspace"] = ctx["workspace"]
    out["flags"] = ctx["flags"]
    out["items"] = ctx["items"]
    out["pair"] = ctx["pair"]
    out["nested_kinds"] = {k: _kind(v) for k, v in sorted(ctx["nested"].items())}
    out["nested_list_kinds"] = [_kind(v) for v in ctx["nested"]["mixed_list"]]
    out["callback_result"] = ctx["callback"]("hello", 3)
    out["client_text"] = ctx["client"].generate_text("ctx")
    out["nested_client_model"] = ctx["nested"]["client"].llm.model_name
    out["list_thing_size"] = ctx["nested"]["mixed_list"][1].size()
    return {"success": True, "output": out}


def tool_discussion(discussion_instance=None):
    """Reads and changes the discussion."""
    d = discussion_instance
    msg = d.add_message(sender="user", content="hello from the tool")
    return {"success": True, "output": {
        "id": d.id,
        "message_kind": _kind(msg),
        "message_content": msg.content,
        "count": len(d.messages),
        "export": d.export(format_type="openai_chat"),
        "system_prompt": getattr(d, "system_prompt", None),
    }}


def tool_slow_host(lollms_client_instance=None):
    """Calls a host method that takes a while (time in the host does not count)."""
    return lollms_client_instance.slow_text(0.8)


def tool_no_host_params(x: int = 1):
    """Declares no host parameter: nothing is injected.

    Args:
        x (int): a number.
    """
    return {"success": True, "output": x}


def tool_var_kw(**kwargs):
    """Declares **kwargs: host objects are injected too."""
    c = kwargs.get("lollms_client_instance")
    return {"success": True, "output": {
        "keys": sorted(kwargs),
        "model": c.llm.model_name if c is not None else None,
    }}
