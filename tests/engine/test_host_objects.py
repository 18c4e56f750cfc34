"""Host objects lent to sandboxed tools: live host objects through proxies.

A tool declaring ``lollms_client_instance``, ``discussion_instance`` or
``tool_context`` gets, in its worker, proxies of the host's objects.  These
tests run the libraries of tests/fixtures/lollms_libs/ through SandboxedBinding and,
where lollms_client is installed, through its in-process ``LCPBinding`` with
the same (fake) host objects, and require the same results:

* ``host_probe`` reports, as plain data, what a tool sees of its host
  objects: plain values by value, everything else usable as a proxy, host
  exceptions with their type name and message, ``tool_context`` dicts with
  their plain parts by value, live ``emit_progress``;
* ``creative_studio``, an omni-tool that drives the host's LollmsClient: image
  bytes written to the workspace, a caption, optional music, and its guard paths.

Sandbox-only behaviour (a proxy used after its call, the host letting go of
what it lent) is checked against what the binding documents (docs/lollms.md).

In-process runs chdir into their own workspace (LCPBinding does not chdir)
and the modules upstream registers in sys.modules are removed after each test.
"""
from __future__ import annotations

import asyncio
import gc
import re
import threading
import time
import weakref
from pathlib import Path

import pytest
from conftest import FIXTURES

from lcp_sandbox import SandboxedBinding

LOLLMS_LIBS = FIXTURES / "lollms_libs"
PERSISTENT = "lollms_client.tools_bindings.lcp.persistent_"

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(64)
BIG_PNG = PNG + bytes(range(256)) * (6 * 4096)      # ~6 MB, a realistic generated image
CAPTION = "  Waves fold the light away.  A keeper dreams of ships.  "


# ================================================================ fake host objects
class HostQuotaError(Exception):
    """An exception class the worker cannot import (it lives in this test module)."""


class Thing:
    def __init__(self, n):
        self.n = n
        self.label = f"thing-{n}"

    def size(self):
        return self.n

    def child(self):
        return Thing(self.n * 10)

    def __str__(self):
        return f"Thing({self.n})"


class FakeLLM:
    def __init__(self, name):
        self.model_name = name


class Box:
    def __init__(self, items):
        self.items = list(items)

    def __len__(self):
        return len(self.items)


class FakeClient:
    """The LollmsClient surface the tests' tools use (section 12 plus probes).

    Every method records its call and the thread it ran on."""

    def __init__(self, llm=True, tti=True, ttm=True, music=WAV, image=PNG, image_error=None):
        self.llm = FakeLLM("big-model") if llm else None
        self.tti = FakeLLM("painter") if tti else None
        self.ttm = FakeLLM("composer") if ttm else None
        self._music = music
        self._image = image
        self._image_error = image_error
        self.name = "fake"
        self.flag = True
        self.ratio = 0.5
        self.count = 3
        self.nothing = None
        self.things = [Thing(1), Thing(2)]
        self.empty_box = Box([])
        self.full_box = Box([1])
        self.counter = 0
        self.calls = []
        self.threads = set()
        self.made = []

    def _record(self, name, *args, **kwargs):
        self.calls.append((name, args, kwargs))
        self.threads.add(threading.get_ident())

    # -- section 12 surface
    def generate_image(self, prompt, width=512, height=512, **kwargs):
        self._record("generate_image", prompt=prompt, width=width, height=height, **kwargs)
        if self._image_error is not None:
            raise self._image_error
        return self._image

    def generate_text(self, prompt, n_predict=None, streaming_callback=None, **kwargs):
        self._record("generate_text", prompt=prompt, n_predict=n_predict, **kwargs)
        if streaming_callback is not None:
            for word in ("a", "b", "c"):
                streaming_callback(word)
        return CAPTION if "caption" in prompt else f"echo:{prompt}"

    def generate_music(self, prompt, **kwargs):
        self._record("generate_music", prompt=prompt, **kwargs)
        return self._music

    def switch_model(self, alias):
        self._record("switch_model", alias)
        self.llm = FakeLLM(alias)
        return True

    # -- probes
    def get_blob(self):
        self._record("get_blob")
        return b"\x00\x01bytes"

    def get_tuple(self):
        return (1, "a", b"x", None, 2.5, True, (3, 4))

    def get_dict(self):
        return {"a": [1, (2, 3)], 1: None, "b": {"c": b"z"}}

    def get_list(self):
        return [1, "two", [3.0, None], {"k": (5,)}]

    def make_thing(self, n):
        thing = Thing(n)
        self.made.append(weakref.ref(thing))
        return thing

    def get_mixed(self):
        return {"obj": Thing(9), "n": 4}

    def fail(self, kind):
        self._record("fail", kind)
        if kind == "ValueError":
            raise ValueError("bad value 42")
        if kind == "KeyError":
            raise KeyError("missing-key")
        if kind == "custom":
            raise HostQuotaError("quota exceeded for model x")
        if kind == "RuntimeError":
            raise RuntimeError("TTI binding not initialized.")
        if kind == "FileNotFoundError":
            raise FileNotFoundError(2, "No such file or directory", "x.png")
        raise TypeError(f"unknown kind {kind}")

    def is_my_llm(self, obj):
        return obj is self.llm

    def size_of(self, thing):
        return thing.size()

    def all_my_llm(self, objs):
        return all(o is self.llm for o in objs)

    def slow_text(self, seconds):
        self._record("slow_text", seconds)
        time.sleep(seconds)
        return "slow done"


class FakeMessage:
    def __init__(self, sender, content):
        self.sender = sender
        self.content = content


class FakeDiscussion:
    def __init__(self):
        self.id = "disc-1"
        self.system_prompt = "be brief"
        self.messages = []
        self.threads = set()

    def add_message(self, sender, content):
        self.threads.add(threading.get_ident())
        msg = FakeMessage(sender, content)
        self.messages.append(msg)
        return msg

    def export(self, format_type):
        return [{"role": m.sender, "content": m.content} for m in self.messages]


class Progress:
    """A tool_context object: emit_progress records lines (and acknowledges line 0 in `ack_dir`)."""

    def __init__(self, ack_dir=None):
        self.lines = []
        self.ack_dir = ack_dir
        self.threads = set()

    def emit_progress(self, text, meta=None):
        self.threads.add(threading.get_ident())
        self.lines.append((text, meta))
        if text == "line 0" and self.ack_dir is not None:
            (Path(self.ack_dir) / "ack_0").write_text("seen")
        return True


# ================================================================ fixtures
@pytest.fixture(scope="module")
def sandbox(supervisor, tmp_path_factory):
    """One binding over tests/fixtures/lollms_libs for the module; tests pass their workspace per call."""
    b = SandboxedBinding(tools_folders=[str(LOLLMS_LIBS)], supervisor=supervisor, tenant="host-objects",
                         workspace=str(tmp_path_factory.mktemp("default_ws")), timeout_s=20)
    yield b
    b.close()


@pytest.fixture
def ws(tmp_path):
    """Workspaces: 'sb' for the sandbox, 'ip' for the in-process run."""
    out = {}
    for key in ("sb", "ip"):
        out[key] = tmp_path / key
        out[key].mkdir()
    return out


@pytest.fixture
def run(sandbox, ws):
    """run(tool, params, **host) -> sandbox result, in the 'sb' workspace."""
    def call(tool, params=None, **host):
        return sandbox.execute_tool(tool, dict(params or {}), workspace=str(ws["sb"]), **host)
    return call


@pytest.fixture
def inproc(ws, monkeypatch):
    """inproc(tool, params, **host) -> upstream LCPBinding result, CWD = the 'ip' workspace."""
    lcp = pytest.importorskip("lollms_client.tools_bindings.lcp")
    monkeypatch.chdir(ws["ip"])
    binding = lcp.LCPBinding(tools_folders=[str(LOLLMS_LIBS)])

    def call(tool, params=None, **host):
        return binding.execute_tool(tool, dict(params or {}), **host)
    return call


# ================================================================ plain values and proxies
def test_plain_values_by_value_and_objects_as_proxies(run, inproc):
    sb_client, ip_client = FakeClient(), FakeClient()
    sb = run("tool_client_values", lollms_client_instance=sb_client)
    ip = inproc("tool_client_values", lollms_client_instance=ip_client)
    assert sb["success"] is True, sb
    # A dict holding a non-plain object arrives as a dict whose plain items are values and
    # whose objects are proxies (as tool_context), so isinstance(x, dict) holds as in-process.
    assert sb["output"]["mixed_kind"] == ip["output"]["mixed_kind"] == "dict"
    assert sb == ip
    out = sb["output"]
    # by value, with their exact types
    assert out["blob"] == b"\x00\x01bytes" and out["blob_kind"] == "bytes"
    assert out["tuple"] == (1, "a", b"x", None, 2.5, True, (3, 4)) and out["tuple_kind"] == "tuple"
    assert out["dict"] == {"a": [1, (2, 3)], 1: None, "b": {"c": b"z"}} and out["dict_kind"] == "dict"
    assert out["list"] == [1, "two", [3.0, None], {"k": (5,)}]
    assert (out["name"], out["flag"], out["ratio"], out["count"], out["nothing"]) == ("fake", True, 0.5, 3, None)
    # `client.llm is None` as in-process
    assert out["llm_is_none"] is False and out["tti_is_none"] is False
    # everything else is a further proxy, usable like the object
    assert out["llm_kind"] == out["thing_kind"] == "object"
    assert out["model_name"] == "big-model" and out["model_after_switch"] == "fast"
    assert (out["thing_size"], out["thing_label"], out["thing_child_size"]) == (5, "thing-5", 50)
    assert (out["mixed_obj_size"], out["mixed_n"], out["mixed_len"], out["mixed_has_obj"]) == (9, 4, 2, True)
    assert out["things_sizes"] == [1, 2] and out["things_len"] == 2
    assert (out["empty_truth"], out["full_truth"]) == (False, True)
    assert out["counter"] == 42 and sb_client.counter == 42          # setattr reached the host object
    assert out["str_of_thing"] == "Thing(5)"
    assert (out["has_llm"], out["has_nope"], out["getattr_default"]) == (True, False, "fallback")
    # the host object really was used (not a copy)
    assert sb_client.llm.model_name == "fast"
    assert [c[0] for c in sb_client.calls] == [c[0] for c in ip_client.calls]


def test_host_calls_run_on_the_thread_waiting_for_the_call(run):
    client, disc, ctx = FakeClient(), FakeDiscussion(), Progress()
    assert run("tool_client_values", lollms_client_instance=client)["success"]
    assert run("tool_discussion", discussion_instance=disc)["success"]
    assert run("tool_stream_threads", {"per_thread": 1, "threads": 1}, tool_context=ctx)["success"]
    me = threading.get_ident()
    assert client.threads == {me} and disc.threads == {me} and ctx.threads == {me}


def test_proxies_handed_back_to_the_host_are_the_original_objects(run, inproc):
    sb = run("tool_pass_back", lollms_client_instance=FakeClient())
    ip = inproc("tool_pass_back", lollms_client_instance=FakeClient())
    for key in ("same_llm", "same_llm_kw", "thing_size_via_host"):
        assert sb["output"][key] == ip["output"][key], key
    assert sb["output"]["same_llm"] is True and sb["output"]["same_llm_kw"] is True
    assert sb["output"]["thing_size_via_host"] == 7


def test_proxies_nested_in_arguments_are_the_original_objects(run, inproc):
    """`client.all_my_llm([llm, llm])`: a proxy inside a list argument must reach the host
    as the object it stands for, as in-process."""
    sb = run("tool_pass_back", lollms_client_instance=FakeClient())
    ip = inproc("tool_pass_back", lollms_client_instance=FakeClient())
    assert ip["output"]["same_llm_in_list"] is True
    assert sb["output"]["same_llm_in_list"] is True


def test_callbacks_passed_to_the_host_run_in_the_tool(run, inproc):
    """`client.generate_text(prompt, streaming_callback=on_chunk)` where `on_chunk` is a
    closure of the tool: in-process the chunks land in the tool's list."""
    sb = run("tool_callback_into_tool", lollms_client_instance=FakeClient())
    ip = inproc("tool_callback_into_tool", lollms_client_instance=FakeClient())
    assert ip["output"] == {"full": "echo:stream me", "chunks": ["a", "b", "c"]}
    assert sb["output"] == ip["output"]


def test_var_kw_tools_receive_host_objects_as_in_process(run, inproc):
    sb = run("tool_var_kw", {"a": 1}, lollms_client_instance=FakeClient())
    ip = inproc("tool_var_kw", {"a": 1}, lollms_client_instance=FakeClient())
    assert sb == ip
    assert sb["output"] == {"keys": ["a", "lollms_client_instance"], "model": "big-model"}


def test_tools_not_declaring_host_objects_ignore_them(run, inproc):
    sb = run("tool_no_host_params", {"x": 3}, lollms_client_instance=FakeClient(),
             discussion_instance=FakeDiscussion(), tool_context=Progress())
    ip = inproc("tool_no_host_params", {"x": 3}, lollms_client_instance=FakeClient(),
                discussion_instance=FakeDiscussion(), tool_context=Progress())
    assert sb == ip == {"output": 3, "status_code": 200, "success": True}


# ================================================================ exceptions
KINDS = ["ValueError", "KeyError", "custom", "RuntimeError", "FileNotFoundError"]


@pytest.mark.parametrize("kind", KINDS)
def test_host_exceptions_keep_type_name_and_message(run, inproc, kind):
    sb = run("tool_host_error", {"kind": kind}, lollms_client_instance=FakeClient())
    ip = inproc("tool_host_error", {"kind": kind}, lollms_client_instance=FakeClient())
    assert sb["success"] is True, sb
    assert sb["output"]["type"] == ip["output"]["type"]
    assert sb["output"]["message"] == ip["output"]["message"]
    assert sb["output"] == ip["output"]          # builtin classes keep their hierarchy too


@pytest.mark.parametrize("kind", ["ValueError", "custom", "KeyError"])
def test_uncaught_host_exception_fails_the_call_as_in_process(run, inproc, kind):
    sb = run("tool_host_error_uncaught", {"kind": kind}, lollms_client_instance=FakeClient())
    ip = inproc("tool_host_error_uncaught", {"kind": kind}, lollms_client_instance=FakeClient())
    assert sb["status_code"] == ip["status_code"] == 500
    assert sb["error"] == ip["error"]
    assert sb["output"] == ip["output"]
    assert "traceback" in sb and "traceback" in ip


def test_missing_attribute_raises_attribute_error(run, inproc):
    sb = run("tool_missing_attribute", lollms_client_instance=FakeClient())
    ip = inproc("tool_missing_attribute", lollms_client_instance=FakeClient())
    assert sb == ip
    assert sb["output"]["type"] == "AttributeError"


# ================================================================ lifetime
@pytest.mark.parametrize("what", ["client", "llm", "thing", "discussion", "tool_context"])
def test_proxy_used_after_its_call_gives_a_clear_error(run, what):
    client = FakeClient()
    kept = run("tool_keep", lollms_client_instance=client, discussion_instance=FakeDiscussion(),
               tool_context=Progress())
    assert kept["output"] == 3
    late = run("tool_use_kept", {"what": what})
    assert late["success"] is True, late
    assert late["output"]["raised"] is True
    assert late["output"]["type"] == "RuntimeError"
    assert "call" in late["output"]["message"] and (
        "released" in late["output"]["message"] or "no longer" in late["output"]["message"])
    # also while another call lends new objects
    late = run("tool_use_kept", {"what": what}, lollms_client_instance=FakeClient())
    assert late["output"]["raised"] is True and late["output"]["type"] == "RuntimeError"
    assert [c[0] for c in client.calls] == []        # nothing reached the old client


def test_thread_using_a_proxy_between_calls_gets_an_error(run):
    client = FakeClient()
    assert run("tool_background_start", {"delay": 0.2}, lollms_client_instance=client)["success"]
    time.sleep(0.4)                                   # the thread tried while no call was in flight
    res = run("tool_background_result")
    assert res["output"]["value"] is None
    assert res["output"]["error"]["type"] == "RuntimeError"
    assert "call" in res["output"]["error"]["message"]
    assert client.calls == []
    # the worker is unharmed
    assert run("tool_client_values", lollms_client_instance=FakeClient())["success"]


def test_thread_using_a_proxy_during_a_later_call_gets_an_error(run):
    client = FakeClient()
    assert run("tool_background_start", {"delay": 0.2}, lollms_client_instance=client)["success"]
    res = run("tool_background_result", lollms_client_instance=FakeClient())   # in flight while it tries
    assert res["output"]["error"]["type"] == "RuntimeError"
    assert client.calls == []
    assert run("tool_client_values", lollms_client_instance=FakeClient())["success"]


def test_host_releases_what_it_lent_when_the_call_ends(run):
    client = FakeClient()
    assert run("tool_keep", lollms_client_instance=client)["success"]   # the tool keeps proxies
    assert run("tool_client_values", lollms_client_instance=client)["success"]
    gc.collect()
    assert client.made and all(ref() is None for ref in client.made)


def test_binding_keeps_no_reference_to_injected_objects(run):
    client, disc, ctx = FakeClient(), FakeDiscussion(), Progress()
    refs = [weakref.ref(client), weakref.ref(disc), weakref.ref(ctx)]
    assert run("tool_keep", lollms_client_instance=client, discussion_instance=disc,
               tool_context=ctx)["success"]
    del client, disc, ctx
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


class Numbered:
    def __init__(self, n):
        self.n = n

    def value(self):
        return self.n


def test_objects_lent_by_one_call_survive_another_call_ending(supervisor, ws):
    """Objects returned by a host-config callable during a call (no host object injected)
    belong to that call: another library's call ending meanwhile must not release them,
    nor may a later object take their place."""
    import itertools
    counter = itertools.count(1)
    b = SandboxedBinding(tools_folders=[str(LOLLMS_LIBS)], supervisor=supervisor, tenant="host-objects-cfg",
                         host_tool_configs={"host_probe": {"factory": lambda: Numbered(next(counter))}},
                         workspace=str(ws["sb"]), timeout_s=20)
    try:
        assert b.execute_tool("tool_config_objects", {})["output"] == {"first": 1, "second": 2, "first_again": 1}
        assert b.execute_tool(STUDIO, {"subject": "warm-up"})["success"] is False     # start its worker
        out = {}
        slow = threading.Thread(target=lambda: out.update(b.execute_tool("tool_config_objects", {"wait": 0.6})))
        slow.start()
        time.sleep(0.3)
        assert b.execute_tool(STUDIO, {"subject": "meanwhile"})["success"] is False   # ends during the wait
        slow.join(20)
        assert out.get("success") is True, out
        assert out["output"] == {"first": 3, "second": 4, "first_again": 3}
    finally:
        b.close()


def test_time_spent_in_the_host_does_not_count_against_the_timeout(sandbox, ws):
    res = sandbox.execute_tool("tool_slow_host", {}, workspace=str(ws["sb"]),
                               lollms_client_instance=FakeClient(), timeout_s=0.5)
    assert res == {"output": "slow done", "status_code": 200, "success": True}


# ================================================================ tool_context and discussion
def test_emit_progress_reaches_the_host_while_the_tool_runs_in_order(run, inproc, ws):
    sb_ctx, ip_ctx = Progress(ack_dir=ws["sb"]), Progress(ack_dir=ws["ip"])
    sb = run("tool_stream", {"count": 50}, tool_context=sb_ctx)
    ip = inproc("tool_stream", {"count": 50}, tool_context=ip_ctx)
    assert sb == ip == {"output": "emitted 50", "status_code": 200, "success": True}
    assert sb_ctx.lines == ip_ctx.lines == [(f"line {i}", {"i": i}) for i in range(50)]


def test_emit_progress_from_several_threads_of_the_tool(sandbox, supervisor, ws, inproc):
    """A tool streaming from several threads at once (system_shell drains stdout and
    stderr in two threads) must get every reply right and deliver every line, each
    thread's lines in order; the worker stays usable."""
    ip_ctx = Progress()
    ip = inproc("tool_stream_threads", {"per_thread": 200, "threads": 3}, tool_context=ip_ctx)
    assert ip["success"] is True
    b = SandboxedBinding(tools_folders=[str(LOLLMS_LIBS)], supervisor=supervisor,
                         tenant="host-objects-threads", workspace=str(ws["sb"]), timeout_s=5)
    try:
        ctx = Progress()
        res = b.execute_tool("tool_stream_threads", {"per_thread": 200, "threads": 3}, tool_context=ctx)
        assert res == ip == {"output": 600, "status_code": 200, "success": True}
        assert len(ctx.lines) == 600
        for name in ("t0", "t1", "t2"):
            assert [m["i"] for _, m in ctx.lines if m["stream"] == name] == list(range(200))
        after = Progress(ack_dir=ws["sb"])
        assert b.execute_tool("tool_stream", {"count": 3}, tool_context=after)["success"]
        assert [t for t, _ in after.lines] == ["line 0", "line 1", "line 2"]
    finally:
        b.close()


def test_tool_context_dict_plain_parts_by_value_others_as_proxies(run, inproc):
    def context(client):
        return {"workspace": "/w", "flags": {"a": 1, "b": [True, None]}, "items": [1, 2],
                "pair": (1, "x"), "client": client, "callback": lambda s, n: s * n,
                "nested": {"client": client, "mixed_list": [1, Thing(4)], "plain": "p"}}
    sb_client, ip_client = FakeClient(), FakeClient()
    sb = run("tool_context_shape", tool_context=context(sb_client))
    ip = inproc("tool_context_shape", tool_context=context(ip_client))
    assert sb["success"] is True, sb
    assert sb == ip
    out = sb["output"]
    assert out["ctx_kind"] == "dict"
    assert out["kinds"] == {"callback": "object", "client": "object", "flags": "dict", "items": "list",
                            "nested": "dict", "pair": "tuple", "workspace": "str"}
    assert out["nested_kinds"] == {"client": "object", "mixed_list": "list", "plain": "str"}
    assert out["nested_list_kinds"] == ["int", "object"]
    assert out["callback_result"] == "hellohellohello"
    assert out["client_text"] == "echo:ctx" and out["nested_client_model"] == "big-model"
    assert out["list_thing_size"] == 4
    assert sb_client.calls == ip_client.calls


def test_discussion_instance_is_the_live_discussion(run, inproc):
    sb_disc, ip_disc = FakeDiscussion(), FakeDiscussion()
    sb = run("tool_discussion", discussion_instance=sb_disc)
    ip = inproc("tool_discussion", discussion_instance=ip_disc)
    assert sb == ip
    assert sb["output"] == {"id": "disc-1", "message_kind": "object", "message_content": "hello from the tool",
                            "count": 1, "export": [{"role": "user", "content": "hello from the tool"}],
                            "system_prompt": "be brief"}
    assert [m.content for m in sb_disc.messages] == ["hello from the tool"]     # changed in the host


def test_host_objects_with_aexecute_tool(sandbox, ws):
    client = FakeClient()
    res = asyncio.run(sandbox.aexecute_tool("tool_client_values", {}, lollms_client_instance=client,
                                            workspace=str(ws["sb"])))
    assert res["success"] is True and res["output"]["generated"] == "echo:tell me"
    assert client.llm.model_name == "fast"


def test_concurrent_calls_lend_their_own_objects(sandbox, ws):
    """Two libraries called at once from two threads, each with its own client."""
    results, clients = {}, {"probe": FakeClient(), "studio": FakeClient()}
    threads_used = {}

    def probe():
        threads_used["probe"] = threading.get_ident()
        results["probe"] = sandbox.execute_tool("tool_client_values", {}, workspace=str(ws["sb"]),
                                                lollms_client_instance=clients["probe"])

    def studio():
        threads_used["studio"] = threading.get_ident()
        results["studio"] = sandbox.execute_tool(
            "tool_create_illustrated_audio_story", {"subject": "a fox"}, workspace=str(ws["ip"]),
            lollms_client_instance=clients["studio"])

    ts = [threading.Thread(target=probe), threading.Thread(target=studio)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert results["probe"]["success"] and results["studio"]["success"], results
    assert clients["probe"].threads == {threads_used["probe"]}
    assert clients["studio"].threads == {threads_used["studio"]}
    assert "generate_image" not in [c[0] for c in clients["probe"].calls]
    assert "get_blob" not in [c[0] for c in clients["studio"].calls]


# ====================================================================== creative_studio
_RANDOM = re.compile(r"\b(story|theme)_[0-9a-f]{8}\.(png|wav)\b")
STUDIO = "tool_create_illustrated_audio_story"


def scrub(value):
    """Replace the uuid-based file names by placeholders, recursively."""
    if isinstance(value, str):
        return _RANDOM.sub(lambda m: f"{m.group(1)}_<id>.{m.group(2)}", value)
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(scrub(v) for v in value)
    return value


def files_of(folder):
    return {scrub(p.name): p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def test_creative_studio_schema_shows_only_llm_parameters(sandbox):
    spec = next(t for t in sandbox.discover_tools() if t["name"] == STUDIO)
    assert set(spec["input_schema"]["properties"]) == {"subject", "style", "with_music"}
    assert spec["input_schema"]["required"] == ["subject"]


SCENARIOS = {
    # name: (client factory, params, expected files, expected modality calls)
    "image_caption_music": (lambda: FakeClient(), {"subject": "a lighthouse in a storm"},
                            {"story_<id>.png": PNG, "theme_<id>.wav": WAV},
                            ["generate_image", "generate_text", "generate_music"]),
    "large_image": (lambda: FakeClient(image=BIG_PNG), {"subject": "a harbour at dawn"},
                    {"story_<id>.png": BIG_PNG, "theme_<id>.wav": WAV},
                    ["generate_image", "generate_text", "generate_music"]),
    "no_music_requested": (lambda: FakeClient(), {"subject": "a fox", "style": "pixel art", "with_music": False},
                           {"story_<id>.png": PNG}, ["generate_image", "generate_text"]),
    "no_ttm_binding": (lambda: FakeClient(ttm=False), {"subject": "a fox"},
                       {"story_<id>.png": PNG}, ["generate_image", "generate_text"]),
    "music_not_bytes": (lambda: FakeClient(music={"status": "queued"}), {"subject": "a fox"},
                        {"story_<id>.png": PNG}, ["generate_image", "generate_text", "generate_music"]),
    "llm_is_none": (lambda: FakeClient(llm=False), {"subject": "a fox"}, {}, []),
    "tti_is_none": (lambda: FakeClient(tti=False), {"subject": "a fox"}, {}, []),
    "nothing_configured": (lambda: FakeClient(llm=False, tti=False, ttm=False), {"subject": "a fox"}, {}, []),
    "no_client": (lambda: None, {"subject": "a fox"}, {}, []),
    "image_generation_fails": (lambda: FakeClient(image_error=RuntimeError("TTI binding not initialized.")),
                               {"subject": "a fox"}, {}, ["generate_image"]),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_creative_studio_through_the_sandbox_as_in_process(run, inproc, ws, scenario):
    factory, params, files, calls = SCENARIOS[scenario]
    sb_client, ip_client = factory(), factory()
    host_sb = {} if sb_client is None else {"lollms_client_instance": sb_client}
    host_ip = {} if ip_client is None else {"lollms_client_instance": ip_client}
    sb = run(STUDIO, params, **host_sb)
    ip = inproc(STUDIO, params, **host_ip)
    assert scrub(sb) == scrub(ip)
    assert files_of(ws["sb"]) == files_of(ws["ip"]) == files
    if sb_client is not None:
        assert [c[0] for c in sb_client.calls] == calls
        assert sb_client.calls == ip_client.calls          # same prompts and arguments
    if files:
        assert sb["success"] is True
        image = sb["image_filename"]
        assert _RANDOM.fullmatch(image) and (ws["sb"] / image).read_bytes() == files["story_<id>.png"]
        assert 'Caption: "Waves fold the light away.  A keeper dreams of ships."' in sb["output"]
        assert f'<artefact_image id="{image}::0" />' in sb["prompt_injection"]
        if "theme_<id>.wav" in files:
            music = next(p.name for p in ws["sb"].iterdir() if p.suffix == ".wav")
            assert f"music '{music}'" in sb["output"] and f"`{music}`" in sb["prompt_injection"]
        else:
            assert "music" not in sb["output"]
    else:
        assert sb["success"] is False and sb["status_code"] == 500


def test_creative_studio_guard_messages(run):
    assert run(STUDIO, {"subject": "x"})["error"] == \
        "This tool requires a host-injected LollmsClient instance."
    assert run(STUDIO, {"subject": "x"}, lollms_client_instance=FakeClient(llm=False))["error"] == \
        "Missing required modality bindings: text (LLM) and image (TTI) must be configured."
    assert run(STUDIO, {"subject": "x"}, lollms_client_instance=FakeClient(
        image_error=RuntimeError("TTI binding not initialized.")))["error"] == \
        "Creative pipeline failed: TTI binding not initialized."


def test_creative_studio_with_a_real_lollms_client_without_bindings(run, inproc):
    """A real LollmsClient with no modality configured: `client.llm is None` in the worker too."""
    lollms_client = pytest.importorskip("lollms_client")
    client = lollms_client.LollmsClient()
    assert client.llm is None
    sb = run(STUDIO, {"subject": "a fox"}, lollms_client_instance=client)
    ip = inproc(STUDIO, {"subject": "a fox"}, lollms_client_instance=client)
    assert sb == ip
    assert sb["error"] == "Missing required modality bindings: text (LLM) and image (TTI) must be configured."
