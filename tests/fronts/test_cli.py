"""The command line: tools, call, demo (run as a user would, in a subprocess)."""
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

TOOLS = REPO / "tools"


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "lcp_sandbox.fronts.cli", *args], capture_output=True,
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
    assert "Traceback" not in p.stderr           # (the zygote told a closing host of a fork)


# ================================================================ mistakes get one line and exit 2
def test_a_folder_that_does_not_exist_is_an_error(tmp_path):
    missing = tmp_path / "no_such"
    for args in (("tools", str(missing)), ("tools", str(TOOLS), str(missing)), ("call", str(missing), "tool_x"),
                 ("demo", str(missing))):
        p = cli(*args)
        assert p.returncode == 2, (args, p.stdout)
        assert p.stdout == "" and p.stderr.strip() == f"lcp-sandbox {args[0]}: tools folder {str(missing)!r} does not exist"


def test_params_that_are_not_an_object_give_one_line_not_a_traceback():
    for text, kind in (("[]", "an array"), ("[1]", "an array"), ('"x"', "a string"), ("3", "a number")):
        p = cli("call", str(TOOLS), "tool_list_files", "--params", text)
        assert p.returncode == 2 and p.stdout == ""
        assert p.stderr.strip().splitlines() == [
            f"lcp-sandbox call: --params must be a JSON object of parameter names to values, not {kind}: {text}"]


def test_params_that_give_a_key_twice_are_refused_naming_it():
    """JSON keeps the last of two equal keys; the command refuses them, naming which."""
    p = cli("call", str(TOOLS), "tool_read_file", "--params",
            '{"file_name": "a.txt", "file_name": "b.txt"}')
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "lcp-sandbox call: --params: the key 'file_name' is given twice at file_name: JSON "
        "readers keep one of the two silently (Python's the last); give each key once"]


# ================================================================ -v anywhere, help
def test_verbose_works_before_and_after_the_subcommand(tmp_path):
    quiet = cli("call", str(TOOLS), "tool_list_files", "--workspace", str(tmp_path))
    assert quiet.returncode == 0 and "lcp_sandbox.events" not in quiet.stderr
    for args in (("-v", "call", str(TOOLS), "tool_list_files"), ("call", "-v", str(TOOLS), "tool_list_files"),
                 ("call", str(TOOLS), "tool_list_files", "--verbose")):
        p = cli(*args, "--workspace", str(tmp_path))
        assert p.returncode == 0, p.stderr
        assert "INFO lcp_sandbox.events" in p.stderr and "'event': 'start'" in p.stderr, args


def test_help_lists_every_subcommand_and_describes_call_arguments():
    p = cli("--help")
    assert p.returncode == 0
    for name in ("tools", "call", "demo", "bench"):
        assert f"lcp-sandbox {name}" in p.stdout and f"    {name} " in p.stdout, name
    p = cli("call", "--help")
    for words in ("folder of tool libraries", "tool name", "a JSON object", "working directory", "timeout"):
        assert words in p.stdout, words


def test_bench_is_listed_with_how_to_run_it_when_it_cannot_be_imported(monkeypatch, capsys):
    from lcp_sandbox.fronts import cli as cli_module
    monkeypatch.setitem(sys.modules, "benchmarks.cli", None)             # import fails
    with pytest.raises(SystemExit):
        cli_module.main(["--help"])
    out = capsys.readouterr().out
    assert "python -m benchmarks.run" in " ".join(out.split()) and "    bench " in out
    assert cli_module.main(["bench", "--quick"]) == 2
    assert "python -m benchmarks.run" in capsys.readouterr().err


def test_bench_comes_from_the_checkout_beside_the_package_only(tmp_path):
    """A module named `benchmarks` elsewhere on the path never answers `lcp-sandbox bench`;
    the checkout's harness does, from any folder."""
    fake = tmp_path / "benchmarks"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('hijacked')\n")
    p = subprocess.run([sys.executable, "-m", "lcp_sandbox.fronts.cli", "bench", "--help"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert p.returncode == 0 and "hijacked" not in p.stdout + p.stderr, p.stderr
    assert "usage: lcp-sandbox bench" in p.stdout and "--quick" in p.stdout


# ================================================================ demo on the user's own folder
def test_demo_on_a_user_folder_calls_only_the_tools_named(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "mine.py").write_text(
        "from pathlib import Path\n"
        "def tool_touch_marker() -> dict:\n"
        "    '''Leaves a marker file next to this library.'''\n"
        "    Path(__file__).with_name('called.txt').write_text('x')\n"
        "    return {'success': True, 'output': 'touched'}\n"
        "def tool_abort() -> dict:\n"
        "    '''Kills its process.'''\n"
        "    import os; os.abort()\n")
    p = cli("demo", str(folder), "--calls", "5", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert not (folder / "called.txt").exists()                 # no tool of the folder ran
    assert "tool_touch_marker, tool_abort" in p.stdout and "--tool NAME" in p.stdout
    assert "quarantine" not in p.stdout
    p = cli("demo", str(folder), "--tool", "tool_touch_marker", "--calls", "5", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (folder / "called.txt").exists()
    assert "warm p50 over 5 successful calls" in p.stdout and "abort" not in p.stdout.split("segfaults")[0]


def test_demo_never_times_failed_calls(tmp_path):
    folder = tmp_path / "flaky"
    folder.mkdir()
    (folder / "flaky.py").write_text(
        "CALLS = [0]\n"
        "def tool_flaky(every: int = 2) -> dict:\n"
        "    '''Fails on every other call.'''\n"
        "    CALLS[0] += 1\n"
        "    if CALLS[0] % every == 0:\n"
        "        return {'success': False, 'error': 'flaked'}\n"
        "    return {'success': True, 'output': CALLS[0]}\n"
        "def tool_broken() -> dict:\n"
        "    '''Always fails.'''\n"
        "    raise ValueError('broken')\n")
    p = cli("demo", str(folder), "--tool", "tool_flaky", "--params", '{"every": 2}', "--tool", "tool_broken",
            "--calls", "10", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    flaky = p.stdout.split("tool_flaky(")[1].split("\n\n")[0]
    assert "warm p50 over 5 successful calls" in flaky and "5 of 10 warm calls failed (not timed" in flaky
    broken = p.stdout.split("tool_broken(")[1].split("\n\n")[0]
    assert "status 500" in broken and "not timed" in broken and "p50" not in broken


def test_output_into_a_pipe_closed_early_ends_quietly(tmp_path):
    """`lcp-sandbox tools FOLDER | head`: the reader leaves after a line; no traceback."""
    for i in range(40):
        (tmp_path / f"lib{i}.py").write_text("".join(
            f'def tool_t{i}_{j}(a: int = 1) -> dict:\n    """{"many words " * 30}"""\n'
            f'    return {{}}\n\n' for j in range(10)))
    proc = subprocess.Popen([sys.executable, "-m", "lcp_sandbox.fronts.cli", "tools", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout.readline().strip() == b"["
    proc.stdout.close()                            # as `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_engines_warnings_show_by_default(tmp_path):
    lib = tmp_path / "lib.py"
    lib.write_text('def tool_x() -> dict:\n    """x"""\n    return {"success": True, "output": 1}\n')
    r = cli("call", str(tmp_path), "tool_x", "--workspace", str(tmp_path / "ws"))
    assert r.returncode == 0
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "lib.py").write_text('import os\nos._exit(3)\n\ndef tool_x() -> dict:\n    """x"""\n    return {}\n')
    r = cli("call", str(bad), "tool_x", "--workspace", str(tmp_path / "ws"))
    assert r.returncode == 1 and "WARNING lcp_sandbox" in r.stderr, r.stderr


def test_disks_list_and_prune_name_their_root_and_find_nothing_in_an_empty_one(tmp_path):
    """`lcp-sandbox disks list|prune ROOT` (tests/confinement/test_disks.py runs them over real disks):
    a ROOT that is not a folder is one line and exit status 2; an empty one lists nothing."""
    p = cli("--help")
    assert "lcp-sandbox disks list|prune ROOT" in p.stdout and "    disks " in p.stdout
    for cmd in ("list", "prune"):
        p = cli("disks", cmd, str(tmp_path / "none"))
        assert p.returncode == 2 and p.stderr.strip() == (
            f"lcp-sandbox disks: {str(tmp_path / 'none')!r} is not a folder")
        p = cli("disks", cmd, str(tmp_path))
        assert (p.returncode, p.stdout) == (0, ""), p.stderr
    assert json.loads(cli("disks", "list", str(tmp_path), "--json").stdout) == []


@pytest.mark.parametrize("argv", [
    # argparse alone would read each as the longer flag it begins
    ["serve-mcp", "F", "--max-workers-", "3"],
    ["serve-mcp", "F", "--max-workers-per", "3"],
    ["serve-mcp", "F", "--network-al", "example.com"],
    ["envs", "list", "--sto", "S"],
    ["disks", "prune", "--verb", "R"],
])
def test_a_flag_is_taken_by_its_whole_name_only(argv, capsys):
    from lcp_sandbox.fronts.cli import build_parser
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(argv)
    assert raised.value.code == 2
    assert f"unrecognized arguments: {argv[-2]}" in capsys.readouterr().err
