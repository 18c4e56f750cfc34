"""The same calls through lollms_client's in-process LCPBinding and through SandboxedBinding:
the same specs and the same results (tracebacks compared by their last line)."""

import pytest
from conftest import FIXTURES
from lollms_client.tools_bindings.lcp import LCPBinding

from lcp_sandbox import SandboxedBinding

CORPUS = FIXTURES / "results_corpus"

CALLS = [
    ("tool_canonical", {}), ("tool_canonical", {"text": "yo"}), ("tool_plain_string", {}),
    ("tool_plain_list", {}), ("tool_none", {}), ("tool_empty_output", {}),
    ("tool_explicit_failure", {}), ("tool_failure_message_only", {}), ("tool_status_error", {}),
    ("tool_return_code", {}), ("tool_zero_return_code", {}), ("tool_error_key", {}),
    ("tool_error_but_success", {}), ("tool_meta_only", {}), ("tool_rest_as_output", {}),
    *[("tool_payload_keys", {"which": k}) for k in ("result", "data", "response", "papers", "content", "text")],
    ("tool_passthrough", {}), ("tool_raises", {}), ("tool_raises", {"kind": "system_exit"}),
    ("tool_raises", {"kind": "keyboard"}), ("tool_defaults", {"a": 1}),
    ("tool_defaults", {"a": 1, "b": 5, "unknown": True}), ("tool_defaults", {}),
    ("tool_varkw", {"x": 1, "y": 2, "tool_context": None}), ("tool_missing", {}),
]


@pytest.fixture(scope="module")
def bindings(supervisor, tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    ours = SandboxedBinding(tools_folders=[CORPUS], supervisor=supervisor, workspace=str(ws))
    theirs = LCPBinding(tools_folders=[CORPUS])
    yield ours, theirs, ws
    ours.close()


def _comparable(result: dict) -> dict:
    out = dict(result)
    if "traceback" in out:
        out["traceback"] = out["traceback"].strip().splitlines()[-1]
    return out


def test_same_specs(bindings):
    ours, theirs, _ = bindings
    public = lambda specs: {s["name"]: (s["description"], s["input_schema"]) for s in specs}
    assert public(ours.discover_tools()) == public(theirs.discover_tools())


@pytest.mark.parametrize("tool,params", CALLS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CALLS)])
def test_same_result(bindings, monkeypatch, tool, params):
    ours, theirs, ws = bindings
    monkeypatch.chdir(ws)                        # in-process tools run in the process CWD
    expected = theirs.execute_tool(tool, dict(params))
    got = ours.execute_tool(tool, dict(params))
    assert _comparable(got) == _comparable(expected)
