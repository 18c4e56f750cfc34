"""lollms_client's own bundled tool libraries through SandboxedBinding, against LCPBinding.

Every scenario runs twice with the same host configuration: through
SandboxedBinding (workers, proxies, relayed handlers) and through
lollms_client's in-process LCPBinding (CWD = its own workspace).  Results,
the files written, the confirmation and user-interaction requests the host's
handlers receive and the progress lines a lollms ``ToolContext`` streams must
be the same; workspace paths are compared as ``<ws>``.

system_shell runs real commands: only echo, ls and pwd, in tmp_path.  The
"risky" command is ``echo curl`` (safe mode asks because it names a network
tool; it only prints a word).
"""
from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import pytest

from lcp_sandbox import SandboxedBinding

lcp = pytest.importorskip("lollms_client.tools_bindings.lcp")
from lollms_client import LollmsClient  # noqa: E402
from lollms_client.lollms_core import LollmsModelProfile  # noqa: E402
from lollms_client.lollms_discussion import LollmsDiscussion  # noqa: E402
from lollms_client.lollms_types import MSG_TYPE, ToolContext  # noqa: E402

DT = Path(list(importlib.util.find_spec("lollms_client").submodule_search_locations)[0]) \
    / "tools_bindings" / "lcp" / "default_tools"
PERSISTENT = "lollms_client.tools_bindings.lcp.persistent_"
SHELL = "tool_execute_shell_command"
_tenants = itertools.count()


# ================================================================ helpers
class Recorder:
    """A host handler: records every call, answers from `answers` in order (the last repeats)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if isinstance(self.answers[0], BaseException):
            raise self.answers[0]
        return self.answers[min(len(self.calls), len(self.answers)) - 1]


class DictOnlyConfirm(Recorder):
    """A confirm handler that only accepts system_shell's request dict (its last fallback)."""

    def __call__(self, request):
        return super().__call__(request)


class World:
    """One side of a comparison: a binding, its handlers, its workspace, its progress lines."""

    def __init__(self, binding, confirm, ui, ws):
        self.binding, self.confirm, self.ui, self.ws = binding, confirm, ui, ws
        self.events = []

    def context(self):
        return ToolContext(callback=lambda text, kind, meta: self.events.append((text, kind, meta)) or True,
                           workspace_path=self.ws)

    def call(self, tool, params=None, progress=False, **host):
        if progress:
            host["tool_context"] = self.context()
        return scrub(self.binding.execute_tool(tool, dict(params or {}), **host), self.ws)

    def asked(self, which="confirm"):
        handler = self.confirm if which == "confirm" else self.ui
        return scrub(handler.calls, self.ws) if handler is not None else None

    def files(self):
        return {str(p.relative_to(self.ws)): p.read_bytes() for p in sorted(self.ws.rglob("*")) if p.is_file()}


def scrub(value, ws):
    """Replace the workspace path by <ws>, recursively (tuples stay tuples)."""
    if isinstance(value, str):
        return value.replace(str(ws), "<ws>")
    if isinstance(value, dict):
        return {k: scrub(v, ws) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(scrub(v, ws) for v in value)
    return value


def same(sb, ip):
    """Assert both worlds gave the same value; return it."""
    assert sb == ip
    return sb


# ================================================================ fixtures
@pytest.fixture
def both(supervisor, tmp_path, monkeypatch):
    """both(libraries, configs=None, confirm=None, ui=None) -> (sandbox World, in-process World).

    `confirm` / `ui` are answer lists (each world gets its own Recorder), or a
    Recorder class and answers as (cls, answers)."""
    made = []

    def make(libraries, configs=None, confirm=None, ui=None, timeout_s=20):
        worlds = []
        for key in ("sb", "ip"):
            ws = tmp_path / key
            ws.mkdir(exist_ok=True)

            def handler(spec):
                if spec is None:
                    return None
                if isinstance(spec, tuple):
                    return spec[0](spec[1])
                return Recorder(spec)
            c, u = handler(confirm), handler(ui)
            cfg = {k: dict(v) for k, v in (configs or {}).items()}
            folders = [str(DT / lib) for lib in libraries]
            if key == "sb":
                b = SandboxedBinding(tools_folders=folders, host_tool_configs=cfg, confirm_handler=c,
                                     user_interaction_handler=u, workspace=str(ws), supervisor=supervisor,
                                     tenant=f"dt{next(_tenants)}", timeout_s=timeout_s)
                made.append(b)
            else:
                monkeypatch.chdir(ws)
                b = lcp.LCPBinding(tools_folders=folders, host_tool_configs=cfg, confirm_handler=c,
                                   user_interaction_handler=u)
            worlds.append(World(b, c, u, ws))
        return worlds

    yield make
    for b in made:
        b.close()


def run_both(sb, ip, tool, params=None, progress=False, **host):
    return same(sb.call(tool, params, progress, **host), ip.call(tool, params, progress, **host))


# ================================================================ system_shell
@pytest.mark.parametrize("level", ["safe", "strict", "full_access"])
def test_discovery_and_dynamic_prompt_as_in_process(both, level):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": level}})
    sb_spec = scrub(next(t for t in sb.binding.discover_tools() if t["name"] == SHELL), sb.ws)
    ip_spec = scrub(next(t for t in ip.binding.discover_tools() if t["name"] == SHELL), ip.ws)
    for key in ("name", "description", "input_schema"):
        assert sb_spec[key] == ip_spec[key], key
    assert {"safe": "SAFE MODE", "strict": "STRICT MODE", "full_access": "FULL ACCESS"}[level] \
        in sb_spec["description"]
    assert "Working Directory (CWD): <ws>" in sb_spec["description"]
    assert list(sb_spec["input_schema"]["properties"]) == ["command"]      # tool_context hidden


def test_safe_mode_whitelisted_command_runs_without_asking(both):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "safe"}}, confirm=[("allow", "")])
    res = run_both(sb, ip, SHELL, {"command": "echo hello world"}, progress=True)
    assert res == {"output": "$ echo hello world\nhello world\n", "status_code": 200, "success": True}
    assert same(sb.asked(), ip.asked()) == []
    assert same(sb.events, ip.events) == [
        ("hello world", MSG_TYPE.MSG_TYPE_CHUNK, {"stream": "stdout", "tool_progress": True, "was_processed": True})]


@pytest.mark.parametrize("decision", [("allow", ""), ("reject", "no network today"), True, False, "allow"])
def test_safe_mode_risky_command_asks_the_host(both, decision):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "safe"}}, confirm=[decision])
    res = run_both(sb, ip, SHELL, {"command": "echo curl"}, progress=True)
    asked = same(sb.asked(), ip.asked())
    assert asked == [(("echo curl", "[RISKY: Command references network tool 'curl'] shell: echo curl"), {})]
    allowed = decision in (True, "allow") or (isinstance(decision, tuple) and decision[0] == "allow")
    if allowed:
        assert res["success"] is True and res["output"] == "$ echo curl\ncurl\n"
        assert [e[0] for e in same(sb.events, ip.events)] == ["curl"]
    else:
        assert res["success"] is False and res["output"].startswith("🛑 BLOCKED BY SANDBOX")
        assert same(sb.events, ip.events) == []
        if decision == ("reject", "no network today"):
            assert res["error"] == "Blocked by sandbox (safe mode): no network today"


def test_risky_command_without_a_handler_is_refused_without_blocking(both):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "safe"}})
    res = run_both(sb, ip, SHELL, {"command": "echo curl"})
    assert res["success"] is False
    assert "Non-interactive environment" in res["error"]


def test_strict_mode_asks_for_everything(both):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "strict"}}, confirm=[("allow", "")])
    res = run_both(sb, ip, SHELL, {"command": "pwd"}, progress=True)
    assert res == {"output": "$ pwd\n<ws>\n", "status_code": 200, "success": True}
    assert same(sb.asked(), ip.asked()) == [(("pwd", "[STRICT] shell: pwd"), {})]
    assert [e[0] for e in same(scrub(sb.events, sb.ws), scrub(ip.events, ip.ws))] == ["<ws>"]


def test_always_upgrades_the_session_to_full_access(both):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "strict"}},
                  confirm=[("always", ""), ("reject", "should not be asked")])
    run_both(sb, ip, SHELL, {"command": "echo one"})
    res = run_both(sb, ip, SHELL, {"command": "echo curl"})
    assert res["success"] is True and res["output"] == "$ echo curl\ncurl\n"
    assert same(sb.asked(), ip.asked()) == [(("echo one", "[STRICT] shell: echo one"), {})]


def test_full_access_never_asks(both, tmp_path):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "full_access"}}, confirm=[("reject", "")])
    (sb.ws / "a.txt").write_text("a")
    (ip.ws / "a.txt").write_text("a")
    res = run_both(sb, ip, SHELL, {"command": "ls"}, progress=True)
    assert res["output"] == "$ ls\na.txt\n"
    assert same(sb.asked(), ip.asked()) == []


def test_invalid_autonomy_level_falls_back_to_safe(both):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "yolo"}}, confirm=[("reject", "r")])
    res = run_both(sb, ip, SHELL, {"command": "echo curl"})
    assert res["success"] is False
    assert same(sb.asked(), ip.asked())[0][0][1].startswith("[RISKY")


def test_failing_command_reports_return_code_and_stderr(both):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "safe"}})
    res = run_both(sb, ip, SHELL, {"command": "ls no_such_file_here"}, progress=True)
    assert res["success"] is False and res["status_code"] == 500
    assert "no_such_file_here" in res["error"]
    events = same(sb.events, ip.events)
    assert events and all(m["stream"] == "stderr" for _, _, m in events)


def test_confirm_handler_taking_only_a_request_dict(both):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "safe"}},
                  confirm=(DictOnlyConfirm, [("allow", "")]))
    res = run_both(sb, ip, SHELL, {"command": "echo curl"})
    assert res["success"] is True
    asked = same(sb.asked(), ip.asked())
    assert len(asked) == 1 and asked[0][0][0]["action_type"] == "shell_command"
    assert asked[0][0][0]["metadata"] == {"command": "echo curl", "autonomy_level": "safe"}


def test_confirm_handler_that_raises(both):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "safe"}},
                  confirm=[ValueError("the approval UI is gone")])
    res = run_both(sb, ip, SHELL, {"command": "echo curl"})
    assert res["success"] is False
    assert "Confirmation handler failed: the approval UI is gone" in res["error"]


def test_set_confirm_handler_mid_session(both):
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "safe"}})
    first = run_both(sb, ip, SHELL, {"command": "echo curl"})
    assert "Non-interactive environment" in first["error"]
    handlers = {"sb": Recorder([("allow", "")]), "ip": Recorder([("allow", "")])}
    sb.binding.set_confirm_handler(handlers["sb"])
    ip.binding.set_confirm_handler(handlers["ip"])
    res = run_both(sb, ip, SHELL, {"command": "echo curl"})
    assert res["success"] is True
    assert handlers["sb"].calls == handlers["ip"].calls == [
        (("echo curl", "[RISKY: Command references network tool 'curl'] shell: echo curl"), {})]


def test_host_config_set_the_way_lollms_personalities_do(both):
    """Personalities fill host_tool_configs on the live binding, then mount the library."""
    sb, ip = both(["workspace_tools"])
    for w in (sb, ip):
        w.confirm = Recorder([("reject", "not now")])
        w.binding.host_tool_configs.setdefault("system_shell", {})["confirm_handler"] = w.confirm
        w.binding.host_tool_configs.setdefault("system_shell", {})["autonomy_level"] = "strict"
        assert w.binding.mount_tool_library_if_absent("system_shell") is True
    res = run_both(sb, ip, SHELL, {"command": "echo hi"})
    assert res["success"] is False and "not now" in res["error"]
    assert same(sb.asked(), ip.asked()) == [(("echo hi", "[STRICT] shell: echo hi"), {})]


def test_interleaved_stdout_and_stderr_stream_completely(both):
    """system_shell drains stdout and stderr in two threads, each calling
    tool_context.emit_progress: every line must reach the host (each stream in
    order), the command's output must be complete, and the worker must stay usable."""
    sb, ip = both(["system_shell"], {"system_shell": {"autonomy_level": "safe"}}, timeout_s=5)
    cmd = "; ".join(f"echo out{i}; echo err{i} >&2" for i in range(20))
    ip_res = ip.call(SHELL, {"command": cmd}, progress=True)
    sb_res = sb.call(SHELL, {"command": cmd}, progress=True)
    assert ip_res["output"] == f"$ {cmd}\n" + "".join(f"out{i}\n" for i in range(20))
    assert sb_res == ip_res
    for stream, prefix in (("stdout", "out"), ("stderr", "err")):
        lines = [t for t, _, m in ip.events if m["stream"] == stream]
        assert lines == [f"{prefix}{i}" for i in range(20)]
        assert [t for t, _, m in sb.events if m["stream"] == stream] == lines
    sb.events.clear()
    again = sb.call(SHELL, {"command": "echo still here"}, progress=True)
    assert again["output"] == "$ echo still here\nstill here\n"
    assert [t for t, _, _ in sb.events] == ["still here"]


def test_mounted_library_handle_hot_reconfigures_the_worker(both):
    """lollms-code's /shell command: mounted_libraries['system_shell'].init_tools_library(...)."""
    sb, _ = both(["system_shell"], {"system_shell": {"autonomy_level": "safe"}}, confirm=[("reject", "no")])
    assert sb.call(SHELL, {"command": "echo curl"})["success"] is False
    handle = sb.binding.mounted_libraries["system_shell"]
    assert hasattr(handle, "init_tools_library") and not hasattr(handle, "no_such_function")
    handle.init_tools_library({"autonomy_level": "full_access"})
    res = sb.call(SHELL, {"command": "echo curl"})
    assert res["success"] is True and res["output"] == "$ echo curl\ncurl\n"
    assert len(sb.confirm.calls) == 1                          # only the first, rejected, call asked
    handle.init_tools_library({"autonomy_level": "strict"})
    assert sb.call(SHELL, {"command": "echo hi"})["success"] is False
    assert sb.confirm.calls[-1][0] == ("echo hi", "[STRICT] shell: echo hi")


# ================================================================ workspace_tools
def test_workspace_tools_as_in_process(both):
    sb, ip = both(["workspace_tools"])
    steps = [
        ("tool_write_file", {"file_name": "notes.txt", "content": "alpha\nBeta line\n"}),
        ("tool_write_file", {"file_name": "sub/deep.md", "content": "beta gamma\nnothing\n"}),
        ("tool_write_file", {"file_name": "../escape.txt", "content": "x"}),
        ("tool_write_file", {"file_name": "/etc/lcp_sandbox_must_not_exist", "content": "x"}),
        ("tool_read_file", {"file_name": "notes.txt"}),
        ("tool_read_file", {"file_name": "missing.txt"}),
        ("tool_read_file", {"file_name": "../../etc/passwd"}),
        ("tool_read_file", {"file_name": "sub"}),
        ("tool_list_files", {}),
        ("tool_list_files", {"recursive": True}),
        ("tool_list_files", {"directory": "sub"}),
        ("tool_list_files", {"directory": "nope"}),
        ("tool_find_files", {"pattern": "*.md"}),
        ("tool_find_files", {"pattern": "*", "max_results": "1"}),
        ("tool_grep_files", {"pattern": "beta"}),
        ("tool_grep_files", {"pattern": "beta", "search_mode": "case-sensitive"}),
        ("tool_grep_files", {"pattern": "gamma beta", "search_mode": "words"}),
        ("tool_grep_files", {"pattern": "alpha gamma", "search_mode": "fuzzy"}),
        ("tool_grep_files", {"pattern": "(", "search_mode": "exact"}),
        ("tool_grep_files", {"pattern": "x", "search_mode": "bogus"}),
        ("tool_no_such_tool", {}),
    ]
    for tool, params in steps:
        sb_res, ip_res = sb.call(tool, params), ip.call(tool, params)
        assert sb_res == ip_res, (tool, params)
    assert same(sb.files(), ip.files()) == {"notes.txt": b"alpha\nBeta line\n",
                                            "sub/deep.md": b"beta gamma\nnothing\n"}
    assert not (sb.ws.parent / "escape.txt").exists()


# ================================================================ user interaction
UI_ANSWERS = ["sk-1234567890abcd", "us-east", "nightly reports"]


def test_configure_service_connection_asks_the_user(both):
    sb, ip = both(["user_interactive_tools"], ui=UI_ANSWERS)
    res = run_both(sb, ip, "tool_configure_service_connection", {"service_name": "weather_api"})
    assert res["success"] is True and "key: sk-1...abcd" in res["output"]
    requests = same(sb.asked("ui"), ip.asked("ui"))
    assert [r[0][0]["type"] for r in requests] == ["secret", "select", "text"]
    assert requests[1][0][0]["options"] == ["eu-west", "us-east", "us-west", "ap-south"]
    saved = json.loads(same(sb.files(), ip.files())["service_connections.json"])
    assert saved == {"weather_api": {"api_key": UI_ANSWERS[0], "region": "us-east", "description": "nightly reports"}}


@pytest.mark.parametrize("answers", [[None], ["sk-1234567890abcd", ""], [ValueError("dialog closed")]])
def test_configure_service_connection_cancelled(both, answers):
    sb, ip = both(["user_interactive_tools"], ui=answers)
    res = run_both(sb, ip, "tool_configure_service_connection", {"service_name": "weather_api"})
    assert res["success"] is False
    assert same(sb.asked("ui"), ip.asked("ui"))
    assert same(sb.files(), ip.files()) == {}


def test_configure_service_connection_without_a_handler(both):
    sb, ip = both(["user_interactive_tools"])
    res = run_both(sb, ip, "tool_configure_service_connection", {"service_name": "weather_api"})
    assert res["success"] is False and "No user-interaction handler is registered" in res["error"]


def test_test_service_connection_asks_for_the_privilege(both):
    sb, ip = both(["user_interactive_tools"], confirm=[("reject", "offline")])
    missing = run_both(sb, ip, "tool_test_service_connection", {"service_name": "weather_api"})
    assert "No connection named 'weather_api'" in missing["error"]
    for w in (sb, ip):
        (w.ws / "service_connections.json").write_text(json.dumps({"weather_api": {"api_key": "k"}}))
    res = run_both(sb, ip, "tool_test_service_connection",
                   {"service_name": "weather_api", "test_endpoint": "http://127.0.0.1:9/never"})
    assert res["error"] == "Operator denied the network test: offline"
    assert same(sb.asked(), ip.asked()) == [(
        ("GET http://127.0.0.1:9/never\nAuthorization: Bearer <weather_api api key>\n",
         "Send a test network request for service 'weather_api'"), {})]


def test_set_user_interaction_handler_mid_session(both):
    sb, ip = both(["user_interactive_tools"])
    run_both(sb, ip, "tool_configure_service_connection", {"service_name": "svc"})
    handlers = {"sb": Recorder(UI_ANSWERS), "ip": Recorder(UI_ANSWERS)}
    sb.binding.set_user_interaction_handler(handlers["sb"])
    ip.binding.set_user_interaction_handler(handlers["ip"])
    res = run_both(sb, ip, "tool_configure_service_connection", {"service_name": "svc"})
    assert res["success"] is True
    assert handlers["sb"].calls == handlers["ip"].calls and len(handlers["sb"].calls) == 3


@pytest.mark.parametrize("target,confirm", [("production", ("allow", "")), ("production", ("reject", "freeze")),
                                            ("staging", ("reject", "never asked"))])
def test_prepare_deployment_injected_user_interaction_handler(both, target, confirm):
    sb, ip = both(["user_interaction_demo"], confirm=[confirm], ui=["canary", "key-98765", "v1.2.3"])
    res = run_both(sb, ip, "tool_prepare_deployment", {"action": "deploy", "target": target})
    confirms = same(sb.asked(), ip.asked())
    requests = same(sb.asked("ui"), ip.asked("ui"))
    if target == "production":
        assert confirms == [(("prepare_deployment(action=deploy, target=production)", "deploy:production"), {})]
    else:
        assert confirms == []
    if confirm[0] == "reject" and target == "production":
        assert res["error"] == "Operator refused production access: freeze" and requests == []
    else:
        assert res["success"] is True and "strategy: canary, tag: v1.2.3, key: ***8765" in res["output"]
        assert [r[0][0]["type"] for r in requests] == ["select", "secret", "text"]


def test_prepare_deployment_without_a_handler(both):
    sb, ip = both(["user_interaction_demo"])
    res = run_both(sb, ip, "tool_prepare_deployment", {})
    assert res["success"] is False and "No user interaction handler available" in res["error"]


# ================================================================ dummy_test_tool, debug_toolset
def test_dummy_test_tool_as_in_process(both):
    sb, ip = both(["dummy_test_tool"])
    missing = run_both(sb, ip, "tool_dummy_cwd_test", {})
    assert missing["error"] == "File 'dummy.txt' not found in CWD: <ws>"
    for w in (sb, ip):
        (w.ws / "dummy.txt").write_text("dummy content")
    found = run_both(sb, ip, "tool_dummy_cwd_test", {})
    assert found["output"] == "File 'dummy.txt' read successfully from CWD: <ws>. Content: dummy content"
    sb_crash, ip_crash = sb.call("tool_dummy_crash_test"), ip.call("tool_dummy_crash_test")
    assert {k: v for k, v in sb_crash.items() if k != "traceback"} == \
        {k: v for k, v in ip_crash.items() if k != "traceback"}
    assert "Intentional crash" in sb_crash["traceback"]
    # the worker survived the crash with its workspace
    assert run_both(sb, ip, "tool_dummy_cwd_test", {})["success"] is True


def test_debug_toolset_dumps_a_real_discussion(both):
    client = LollmsClient()
    discussion = LollmsDiscussion.create_new(lollms_client=client)
    discussion.add_message(sender="user", content="hello")
    discussion.add_message(sender="assistant", content="hi, how can I help?")
    sb, ip = both(["debug_toolset"])
    assert run_both(sb, ip, "tool_dump_context", {})["success"] is False          # no discussion
    res = run_both(sb, ip, "tool_dump_context", {"file_name": "ctx dump"}, discussion_instance=discussion)
    assert res["success"] is True and res["output"] == "Context successfully dumped to 'ctx_dump.json'."
    dumped = json.loads(same(sb.files(), ip.files())["ctx_dump.json"])
    assert dumped["discussion_id"] == discussion.id
    assert [m["content"] for m in dumped["messages"]] == ["hello", "hi, how can I help?"]


# ================================================================ models_tools (lollms_client_instance)
@pytest.fixture
def model_client():
    client = LollmsClient()
    client.llm_model_profiles_registry["fast"] = LollmsModelProfile(
        name="fast", binding_profile_name="srv", model_name="m-fast", is_default=True, vision_enabled=True,
        supported_reasoning_efforts=["low", "high"])
    client.llm_model_profiles_registry["big"] = LollmsModelProfile(
        name="big", binding_profile_name="srv", model_name="m-big", routing_config={"max_tokens": 100})
    return client


def test_models_tools_with_a_real_lollms_client(both, model_client):
    configs = {"models_tools": {"enable_auto_model_selection": True}}
    sb, ip = both(["models_tools"], configs)
    listed = run_both(sb, ip, "tool_list_models", {}, lollms_client_instance=model_client)
    assert listed["output"].splitlines() == [
        "Configured LLM models:", "- fast → srv / 'm-fast' [default, vision]", "    reasoning efforts: low, high",
        "- big → srv / 'm-big'", "    autorouting: {'max_tokens': 100}"]
    unknown = run_both(sb, ip, "tool_switch_model", {"model_alias": "huge"}, lollms_client_instance=model_client)
    assert unknown["error"].startswith("Unknown model alias 'huge'. Available profiles: big, fast.")
    no_client = run_both(sb, ip, "tool_list_models", {})
    assert "requires a host-injected LollmsClient" in no_client["error"]


# ================================================================ tool_maker, vlm_query (client + discussion)
class _ForgeClient:
    """Answers tool_maker's spin-off generation; records the request."""

    def __init__(self, answer):
        self.answer = answer
        self.requests = []

    def generate_text(self, prompt, system_prompt=None, temperature=None, **kwargs):
        self.requests.append((prompt, system_prompt, temperature, kwargs))
        return self.answer


class _WorkspaceDiscussion:
    """What lollms' personality hands tools as discussion_instance: workspace_data_path is a str."""

    def __init__(self, path):
        self.workspace_data_path = str(path)


FORGED = "def tool_file_compressor(path: str) -> dict:\n    '''Compresses a file.'''\n    return {'success': True}"


@pytest.mark.parametrize("answer,with_discussion", [
    (f'<artifact type="tool" name="file_compressor.py">\n{FORGED}\n</artifact>', True),
    (f'<artifact type="tool" name="file_compressor.py">\n{FORGED}\n</artifact>', False),
    ("Sorry, I cannot do that.", True),
])
def test_tool_maker_uses_the_client_and_the_discussion(both, answer, with_discussion):
    sb, ip = both(["tool_maker"])
    clients = {}
    results = []
    for w in (sb, ip):
        clients[w] = _ForgeClient(answer)
        host = {"lollms_client_instance": clients[w]}
        if with_discussion:
            host["discussion_instance"] = _WorkspaceDiscussion(w.ws / "data")
        results.append(w.call("tool_tool_maker", {"tool_name": "File_Compressor", "description": "zip a file"}, **host))
    res = same(*results)
    assert clients[sb].requests == clients[ip].requests and len(clients[sb].requests) == 1
    assert "Tool Name: file_compressor" in clients[sb].requests[0][0] and clients[sb].requests[0][2] == 0.1
    files = same(sb.files(), ip.files())
    if answer.startswith("<artifact"):
        assert res["success"] is True and "Tool Created:** `file_compressor.py`" in res["prompt_injection"]
        where = "data/lcp_tools/file_compressor.py" if with_discussion else "lcp_tools/file_compressor.py"
        assert files == {where: FORGED.encode()}
    else:
        assert res["error"] == "Spinoff agent failed to generate code inside <artifact> tags." and files == {}
    no_client = run_both(sb, ip, "tool_tool_maker", {"tool_name": "x", "description": "y"})
    assert no_client["error"] == "Lollms client instance is required for spinoff agent generation."


class _VisionLLM:
    def __init__(self, vision=True):
        self.vision_enabled = vision
        self.messages = []

    def generate_from_messages(self, messages, temperature=None, n_predict=None):
        self.messages.append((messages, temperature, n_predict))
        return "  A red square on white.  "


class _VisionClient:
    def __init__(self, vision=True):
        self.llm = _VisionLLM(vision)


@pytest.mark.parametrize("vision", [True, False])
def test_vlm_inspect_image_through_the_client(both, vision):
    sb, ip = both(["vlm_query"])
    clients = {}
    results = []
    for w in (sb, ip):
        (w.ws / "pic.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
        clients[w] = _VisionClient(vision)
        results.append(w.call("tool_inspect_image", {"image_path": "pic.png", "query": "What is it?"},
                              lollms_client_instance=clients[w]))
    res = same(*results)
    assert clients[sb].llm.messages == clients[ip].llm.messages
    if vision:
        assert res["output"] == "A red square on white."
        (messages, temperature, n_predict), = clients[sb].llm.messages
        assert messages[1]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
        assert (temperature, n_predict) == (0.1, 512)
    else:
        assert res["error"] == "No Vision-Language Model (VLM) is mounted."
    missing = run_both(sb, ip, "tool_inspect_image", {"image_path": "nope.png"},
                       lollms_client_instance=_VisionClient())
    assert missing["error"] == "Image file not found: 'nope.png'."
