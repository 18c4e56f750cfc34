"""The command line: tools, call, demo (run as a user would, in a subprocess)."""
import json
import subprocess
import sys

from conftest import REPO

TOOLS = REPO / "tools"


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "lcp_sandbox.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def test_tools_prints_specs_as_json():
    p = cli("tools", str(TOOLS))
    assert p.returncode == 0, p.stderr
    specs = {s["name"]: s for s in json.loads(p.stdout)}
    assert "tool_read_file" in specs and "tool_execute_query" in specs
    assert specs["tool_read_file"]["input_schema"]["required"] == ["file_name"]
    assert not any(k.startswith("_") for s in specs.values() for k in s)       # private keys stay in


def test_call_runs_one_tool(tmp_path):
    (tmp_path / "notes.txt").write_text("hello cli\n")
    p = cli("call", str(TOOLS), "tool_read_file", "--params", '{"file_name": "notes.txt"}',
            "--workspace", str(tmp_path))
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["success"] is True and "hello cli" in json.dumps(result["output"])
    p = cli("call", str(TOOLS), "tool_nope")
    assert p.returncode == 1 and json.loads(p.stdout)["status_code"] == 404
    p = cli("call", str(TOOLS), "tool_read_file", "--params", "{not json")
    assert p.returncode == 2 and "not valid JSON" in p.stderr


def test_demo_survives_a_crash(tmp_path):
    p = cli("demo", "--calls", "20", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "cold (worker start + import + call)" in p.stdout
    assert "SIGSEGV" in p.stdout and "the host lives on" in p.stdout
    assert "still answers with status 200" in p.stdout
