"""Unit tests of lcp_sandbox.normalize (LCP's result shapes) and the failure builders.

The last section replays every case through upstream LCPBinding.execute_tool
(an in-process dynamic tool that returns the case's value) and checks that
normalize() gives the same result.
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from lcp_sandbox.core import normalize as nz
from lcp_sandbox.core.normalize import crashed, failure, normalize, not_found

OK = "Tool executed successfully."
OK_EMPTY = "Tool executed successfully (no output)."


def ok(output, **extra):
    return {"output": output, "status_code": 200, "success": True, **extra}


def bad(output, error):
    return {"output": output, "error": error, "success": False, "status_code": 500}


# Every branch; (tool result, normalized result).  Results with context_files
# are tested separately because they depend on the filesystem.
CASES = {
    # non-dict results are wrapped as a success
    "str": ("hello", ok("hello")),
    "int": (42, ok(42)),
    "list": ([1, 2], ok([1, 2])),
    "tuple": ((1,), ok((1,))),
    "none": (None, ok(OK_EMPTY)),
    "empty_str": ("", ok(OK_EMPTY)),
    "zero": (0, ok(OK_EMPTY)),
    "empty_list": ([], ok(OK_EMPTY)),
    "false": (False, ok(OK_EMPTY)),
    # canonical shapes
    "success_output": ({"success": True, "output": "done"}, ok("done")),
    "success_only": ({"success": True}, ok(OK)),
    "empty_dict": ({}, ok(OK)),
    "success_empty_output": ({"success": True, "output": ""}, ok(OK_EMPTY)),
    "success_none_output": ({"success": True, "output": None}, ok(OK_EMPTY)),
    "success_dict_output": ({"success": True, "output": {"a": 1}}, ok({"a": 1})),
    # a dict with none of the keys normalize looks at: the whole dict is the output
    "plain_dict": ({"ok": True, "rows": [1, {"x": None}]}, ok({"ok": True, "rows": [1, {"x": None}]})),
    "plain_dict_falsy_values": ({"n": 0, "s": ""}, ok({"n": 0, "s": ""})),
    # success False
    # NB: the output fallback runs *before* the failure check (as upstream), so a
    # failure whose dict holds only meta keys gets the output "Tool executed
    # successfully."; the failure output only falls back to `error` when the
    # output is falsy.
    "false_with_error": ({"success": False, "error": "bad"}, bad(OK, "bad")),
    "false_with_message": ({"success": False, "message": "msg"}, bad(OK, "msg")),
    "false_error_beats_message": ({"success": False, "error": "e", "message": "m"}, bad(OK, "e")),
    "false_bare": ({"success": False}, bad(OK, "Tool reported failure.")),
    "false_with_output": ({"success": False, "output": "partial", "error": "e"}, bad("partial", "e")),
    "false_empty_output": ({"success": False, "output": "", "error": "e"}, bad("e", "e")),
    "false_empty_payload": ({"error": "e", "result": ""}, bad("e", "e")),
    "false_none_output_no_error": ({"success": False, "output": None}, bad("Tool failed.", "Tool reported failure.")),
    "false_zero_output_status": ({"status": "failed", "output": 0}, bad("Tool failed.", "Tool status was 'failed'.")),
    "false_error_key_none": ({"success": False, "error": None, "output": ""}, bad(None, "Tool reported failure.")),
    "false_error_none": ({"success": False, "error": None}, bad(OK, "Tool reported failure.")),
    "false_payload": ({"success": False, "data": [1]}, bad([1], "Tool reported failure.")),
    "false_with_rest": ({"success": False, "foo": 1}, bad({"foo": 1}, "Tool reported failure.")),
    # status error / failure / failed (case-insensitive)
    "status_error": ({"status": "error"}, bad(OK, "Tool status was 'error'.")),
    "status_failure": ({"status": "Failure"}, bad(OK, "Tool status was 'failure'.")),
    "status_failed": ({"status": "FAILED", "message": "m"}, bad(OK, "m")),
    "status_failed_error": ({"status": "failed", "error": "e"}, bad(OK, "e")),
    "status_error_payload": ({"status": "error", "detail": "d"}, bad({"detail": "d"}, "Tool status was 'error'.")),
    "status_ok": ({"status": "ok"}, ok(OK)),
    "status_other_kept": ({"status": "done", "n": 1}, ok({"n": 1})),
    "status_error_overrides_success_true": ({"success": True, "status": "error", "output": "o"},
                                            bad("o", "Tool status was 'error'.")),
    # return_code
    "rc_nonzero_stderr": ({"return_code": 2, "stderr": "oops"}, bad(OK, "oops")),
    "rc_nonzero_stdout": ({"return_code": 2, "stderr": "oops", "stdout": "so"}, bad({"stdout": "so"}, "oops")),
    "rc_nonzero_error_first": ({"return_code": 1, "stderr": "s", "error": "e"}, bad(OK, "e")),
    "rc_nonzero_bare": ({"return_code": -9}, bad(OK, "Non-zero return code: -9")),
    "rc_nonzero_with_output": ({"return_code": 1, "output": "log"}, bad("log", "Non-zero return code: 1")),
    "rc_string_zero_fails": ({"return_code": "0"}, bad(OK, "Non-zero return code: 0")),
    "rc_empty_string_fails": ({"return_code": "", "output": "o"}, bad("o", "Non-zero return code: ")),
    "rc_false_is_zero": ({"return_code": False, "output": "o"}, ok("o")),
    "rc_zero": ({"return_code": 0, "stdout": "x"}, ok({"stdout": "x"})),
    "rc_none": ({"return_code": None, "output": "x"}, ok("x")),
    "rc_zero_with_success_false": ({"return_code": 0, "success": False}, bad(OK, "Tool reported failure.")),
    "rc_overrides_status_message": ({"status": "error", "message": "m", "return_code": 3},
                                    bad(OK, "Non-zero return code: 3")),
    # truthy error, unless success is True
    "error_only": ({"error": "e"}, bad(OK, "e")),
    "error_with_output": ({"error": "e", "output": "o"}, bad("o", "e")),
    "error_success_true": ({"success": True, "error": "warn", "output": "o"}, ok("o")),
    "error_success_truthy_not_true": ({"success": 1, "error": "e"}, bad(OK, "e")),
    "error_falsy": ({"error": "", "output": "o"}, ok("o")),
    "error_none_rest": ({"error": None, "x": 1}, ok({"x": 1})),
    "error_dict": ({"error": {"code": 7}, "output": []}, bad({"code": 7}, {"code": 7})),
    # output fallback order: result, data, response, papers, content, text
    "fb_result": ({"result": "r", "data": "d", "text": "t"}, ok("r")),
    "fb_data": ({"data": "d", "response": "x", "text": "t"}, ok("d")),
    "fb_response": ({"response": "x", "papers": "p"}, ok("x")),
    "fb_papers": ({"papers": ["p"], "content": "c"}, ok(["p"])),
    "fb_content": ({"content": "c", "text": "t"}, ok("c")),
    "fb_text": ({"text": "t", "other": 1}, ok("t")),
    "fb_none_payload_falls_to_rest": ({"result": None, "x": 1}, ok({"result": None, "x": 1})),
    "fb_falsy_payload_no_output": ({"data": 0}, ok(OK_EMPTY)),
    "fb_empty_list_payload": ({"success": True, "data": []}, ok(OK_EMPTY)),
    "fb_rest_minus_meta": ({"success": True, "status": "ok", "message": "m", "stderr": "",
                            "return_code": 0, "rows": [1]}, ok({"rows": [1]})),
    "fb_only_meta": ({"success": True, "message": "m", "status": "fine"}, ok(OK)),
    "fb_output_key_wins": ({"output": "o", "result": "r"}, ok("o")),
    # pass-through keys: only on success, only when not None
    "passthrough": ({"output": "o", "image_filename": "a.png", "image_b64": "QUJD", "images": ["x"],
                     "image_media_types": ["image/png"], "prompt_injection": "look", "other": 1},
                    ok("o", image_filename="a.png", image_b64="QUJD", images=["x"],
                       image_media_types=["image/png"], prompt_injection="look")),
    "passthrough_none_dropped": ({"output": "o", "image_filename": None, "prompt_injection": None}, ok("o")),
    "passthrough_falsy_kept": ({"output": "o", "images": [], "prompt_injection": ""},
                               ok("o", images=[], prompt_injection="")),
    "passthrough_not_on_failure": ({"success": False, "error": "e", "prompt_injection": "x",
                                    "image_filename": "a.png", "output": "o"}, bad("o", "e")),
    "passthrough_with_fallback_output": ({"data": "d", "prompt_injection": "p"},
                                         ok("d", prompt_injection="p")),
    "passthrough_in_rest_output": ({"image_filename": "a.png"},
                                   ok({"image_filename": "a.png"}, image_filename="a.png")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_normalize_cases(name):
    value, expected = CASES[name]
    assert normalize(copy.deepcopy(value)) == expected


@pytest.mark.parametrize("name", list(CASES))
def test_tool_dict_is_not_mutated(name):
    value, _ = CASES[name]
    original = copy.deepcopy(value)
    normalize(value)
    assert value == original
    assert type(value) is type(original)


def test_result_does_not_alias_input_output():
    value = {"success": True, "output": {"a": 1}}
    out = normalize(value)
    out["extra"] = 1
    assert "extra" not in value


# ------------------------------------------------------------ context_files
@pytest.fixture
def ws(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("b")
    return tmp_path


def test_context_files_str_resolved_against_cwd(ws):
    out = normalize({"output": "o", "context_files": "a.txt"}, cwd=ws)
    assert out["context_files"] == [str((ws / "a.txt").resolve())]


def test_context_files_list_missing_dropped_dirs_dropped(ws):
    abs_b = ws / "sub" / "b.txt"
    out = normalize({"output": "o", "context_files": ["a.txt", "missing.txt", "sub", str(abs_b),
                                                       "sub/../a.txt", Path("sub/b.txt"), 3, None]},
                    cwd=ws)
    a = str((ws / "a.txt").resolve())
    b = str(abs_b.resolve())
    assert out["context_files"] == [a, b, a, b]
    assert all(os.path.isabs(p) for p in out["context_files"])


def test_context_files_tuple_and_path_accepted(ws):
    assert normalize({"output": "o", "context_files": ("a.txt",)}, cwd=ws)["context_files"] == \
        [str((ws / "a.txt").resolve())]
    assert normalize({"output": "o", "context_files": Path("a.txt")}, cwd=ws)["context_files"] == \
        [str((ws / "a.txt").resolve())]


def test_context_files_relative_to_given_cwd_not_process_cwd(ws, tmp_path_factory, monkeypatch):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)
    assert normalize({"output": "o", "context_files": "a.txt"}, cwd=ws)["context_files"] == \
        [str((ws / "a.txt").resolve())]
    # Without cwd the process cwd is used.
    assert normalize({"output": "o", "context_files": "a.txt"})["context_files"] == []
    (elsewhere / "a.txt").write_text("x")
    assert normalize({"output": "o", "context_files": "a.txt"})["context_files"] == \
        [str((elsewhere / "a.txt").resolve())]


@pytest.mark.parametrize("value", [{"a.txt": 1}, 5, "", []])
def test_context_files_other_shapes(ws, value):
    out = normalize({"output": "o", "context_files": value}, cwd=ws)
    assert out["context_files"] == []


def test_context_files_none_absent_and_failure(ws):
    assert "context_files" not in normalize({"output": "o", "context_files": None}, cwd=ws)
    assert "context_files" not in normalize({"output": "o"}, cwd=ws)
    assert "context_files" not in normalize({"error": "e", "context_files": "a.txt"}, cwd=ws)


def test_context_files_input_not_mutated(ws):
    files = ["a.txt", "missing.txt"]
    value = {"output": "o", "context_files": files}
    normalize(value, cwd=ws)
    assert value == {"output": "o", "context_files": ["a.txt", "missing.txt"]}
    assert value["context_files"] is files


def test_resolve_context_files_never_raises(ws):
    assert nz.resolve_context_files(["a.txt", "\x00bad"], ws) == [str((ws / "a.txt").resolve())]


# --------------------------------------------------------- failure builders
def test_crashed_shape():
    exc = ValueError("nope")
    out = crashed("tool_x", exc, "Traceback...")
    msg = "Tool 'tool_x' crashed: nope"
    assert out == {"output": {"success": False, "error": msg}, "error": msg,
                   "traceback": "Traceback...", "success": False, "status_code": 500}


def test_crashed_base_exception():
    out = crashed("tool_y", KeyboardInterrupt(), "tb")
    assert out["error"] == "Tool 'tool_y' crashed: "
    assert out["status_code"] == nz.TOOL_FAILED == 500


def test_not_found_shape():
    assert not_found("tool_z") == {"error": "Tool 'tool_z' not found.", "status_code": 404}
    assert nz.NOT_FOUND == 404


def test_failure_shape_default_and_extra():
    assert failure("boom") == {"output": "boom", "error": "boom", "success": False, "status_code": 500}
    out = failure("slow", nz.TIMED_OUT, timeout_s=1.5, library="lib")
    assert out == {"output": "slow", "error": "slow", "success": False, "status_code": 504,
                   "timeout_s": 1.5, "library": "lib"}


def test_failure_extra_may_override():
    assert failure("x", 503, success=None)["success"] is None


def test_status_codes():
    assert (nz.NOT_FOUND, nz.TOOL_FAILED, nz.FORBIDDEN, nz.UNAVAILABLE, nz.TIMED_OUT, nz.OUT_OF_MEMORY) == \
        (404, 500, 403, 503, 504, 507)


# ----------------------------------------------- differential vs upstream
lcp = pytest.importorskip("lollms_client.tools_bindings.lcp")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    empty = tmp_path_factory.mktemp("no_tools")
    b = lcp.LCPBinding(tools_folders=[empty])
    assert b.register_tool_from_code("ret", "def tool_ret():\n    return _VALUE\n")
    spec = next(t for t in b.discovered_tools if t["name"] == "tool_ret")
    return b, spec["_dynamic_module"]


def _upstream_normalize(upstream, value):
    b, module = upstream
    module._VALUE = value
    return b.execute_tool("tool_ret", {})


@pytest.mark.parametrize("name", list(CASES))
def test_normalize_matches_upstream(upstream, name):
    value, _ = CASES[name]
    assert normalize(copy.deepcopy(value)) == _upstream_normalize(upstream, copy.deepcopy(value))


@pytest.mark.parametrize("files", ["a.txt", ["a.txt", "missing", "sub/b.txt", "sub"], ("a.txt",), 7])
def test_context_files_match_upstream(upstream, ws, monkeypatch, files):
    monkeypatch.chdir(ws)     # upstream resolves against the process cwd
    value = {"success": True, "output": "o", "context_files": files}
    assert normalize(copy.deepcopy(value), cwd=ws) == _upstream_normalize(upstream, copy.deepcopy(value))
