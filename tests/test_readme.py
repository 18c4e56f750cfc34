"""Every code block of README.md runs as written.

Python blocks run as scripts in a fresh folder holding a copy of the bundled
tools as ./tools; bash blocks are lcp-sandbox commands, run one after the other
in such a folder with the entry point of this interpreter's environment, except
``serve-mcp``, which serves until it is stopped: its command lines are only parsed
here (tests/test_mcp_server.py runs the server); json blocks (MCP client
configurations) must parse and start lcp-sandbox serve-mcp.  The
install commands at the top are what CI itself runs (.ci/run): here only the
commands they end with are checked to exist.  The one fenced block that is not
code (the diagram of "How it is built") is checked to be that diagram.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO
from lcp_sandbox.fronts.cli import build_parser

README = REPO / "README.md"
BIN = Path(sys.executable).parent
ENTRY_POINT = BIN / "lcp-sandbox"

# What a block's run must print, by the section it is in (beyond exiting 0).
EXPECTED_OUTPUT = {
    "Use": ["'matches': ['sales.csv']", "Deleted 'sales.csv'", "'library': 'workspace_tools'"],
    "With lollms_client": ["'status_code': 200", "'success': True"],
    "Hosting many users": ["'alice': {'live_workers': 1", "['start', 'stop']"],
    "More than one machine": ["'status_code': 200", "\nship\n", "'library': 'workspace_tools', 'calls': 2, 'node': '"],
}


@dataclass
class Block:
    lang: str
    code: str
    section: str
    line: int

    @property
    def id(self) -> str:
        return f"{self.lang or 'text'}:{self.section}:{self.line}"


def readme_blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    blocks, section, fence, lang, start, lines = [], "(top)", None, "", 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if fence is None:
            if line.startswith("#"):
                section = line.lstrip("#").strip()
            elif line.startswith("```"):
                fence, lang, start, lines = "```", line[3:].strip(), number, []
        elif line.startswith("```"):
            blocks.append(Block(lang, "\n".join(lines) + "\n", section, start))
            fence = None
        else:
            lines.append(line)
    assert fence is None, f"README.md: the block opened on line {start} is never closed"
    return blocks


BLOCKS = readme_blocks()


@pytest.fixture
def folder(tmp_path) -> Path:
    """A fresh folder with the bundled tools as ./tools, as a reader would have."""
    shutil.copytree(REPO / "tools", tmp_path / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_readme_has_the_blocks_this_test_knows():
    langs = {}
    for b in BLOCKS:
        langs.setdefault(b.lang, []).append(b.section)
    assert set(langs) == {"python", "bash", "", "json"}, langs
    assert langs[""] == ["How it is built"]                  # the diagram: not code
    assert "Use" in langs["python"] and "Hosting many users" in langs["python"]
    assert set(EXPECTED_OUTPUT) <= set(langs["python"])


def test_the_diagram_is_not_code():
    (diagram,) = [b for b in BLOCKS if not b.lang]
    assert "host thread" in diagram.code and "worker process" in diagram.code


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "python"], ids=lambda b: b.id)
def test_python_block_runs(block, folder):
    if "lollms_client" in block.code and importlib.util.find_spec("lollms_client") is None:
        pytest.skip("this block needs lollms_client (the lollms or test extra)")
    if "RaySupervisor" in block.code and importlib.util.find_spec("ray") is None:
        pytest.skip("this block needs ray (the ray or test extra)")
    script = folder / "block.py"
    script.write_text(block.code, encoding="utf-8")
    # A block with RaySupervisor(address=None) would join this session's test cluster, if one
    # runs (tests/conftest.py ray_cluster): it gets a local Ray instance of its own instead.
    env = {**os.environ, "RAY_ADDRESS": "local"} if "RaySupervisor" in block.code else None
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=folder,
                       env=env)
    assert p.returncode == 0, f"README.md line {block.line}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    for expected in EXPECTED_OUTPUT.get(block.section, []):
        assert expected in p.stdout, (block.section, expected, p.stdout[-3000:])


def commands(block: Block) -> list[list[str]]:
    out = []
    for line in block.code.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            out.append(argv)
    return out


INSTALL = [b for b in BLOCKS if b.lang == "bash" and "pip install" in b.code]


def test_install_commands_are_what_ci_runs_and_end_in_commands_that_exist():
    """The install blocks themselves are run by CI (.ci/run: venv, pip install -e ".[test]",
    the test command); here: what they end with exists in this environment."""
    assert len(INSTALL) == 1
    ends = [chain.split("&&")[-1].strip() for chain in INSTALL[0].code.splitlines()
            if chain.strip() and not chain.startswith("#")]
    assert ends == [".venv/bin/lcp-sandbox demo", ".venv/bin/python -m pytest -q"]
    assert '.venv/bin/pip install -e ".[test]"' in INSTALL[0].code
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip" install -q -e ".[test]"' in ci and 'python" -m pytest -q' in ci
    assert ENTRY_POINT.is_file(), ENTRY_POINT
    demo = subprocess.run([str(ENTRY_POINT), "demo", "--help"], capture_output=True, text=True, timeout=60)
    assert demo.returncode == 0 and "usage: lcp-sandbox demo" in demo.stdout
    pytest_ok = subprocess.run([sys.executable, "-m", "pytest", "--version"], capture_output=True, text=True,
                               timeout=60)
    assert pytest_ok.returncode == 0


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "json"], ids=lambda b: b.id)
def test_json_block_is_an_mcp_client_configuration(block):
    config = json.loads(block.code)
    for server in config["mcpServers"].values():
        assert server["command"] == "lcp-sandbox" and server["args"][0] == "serve-mcp", server
        build_parser().parse_args(server["args"])


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "bash" and b not in INSTALL], ids=lambda b: b.id)
def test_bash_block_runs(block, folder):
    cmds = commands(block)
    assert cmds
    for argv in cmds:
        assert argv[0] == "lcp-sandbox", f"README.md line {block.line}: not an lcp-sandbox command: {argv}"
        if argv[1] == "serve-mcp":              # serves until stopped: only parsed (see the docstring)
            build_parser().parse_args(argv[1:])
            continue
        p = subprocess.run([str(ENTRY_POINT), *argv[1:]], capture_output=True, text=True, timeout=120,
                           cwd=folder)
        assert p.returncode == 0, f"{shlex.join(argv)}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        if argv[1] == "call":
            assert '"success": true' in p.stdout, p.stdout
    if any(c[1] == "call" for c in cmds):                    # the calls wrote, then read, in ./ws
        assert (folder / "ws" / "notes.txt").read_text() == "hi"


def test_readme_mentions_only_commands_the_cli_has():
    helps = subprocess.run([str(ENTRY_POINT), "--help"], capture_output=True, text=True, timeout=60).stdout
    used = set(re.findall(r"lcp-sandbox ([\w-]+)", README.read_text(encoding="utf-8")))
    assert used and used <= {"tools", "call", "demo", "bench", "serve-mcp", "envs"}
    for name in used:
        assert f"    {name} " in helps, name


def test_the_speed_table_is_the_harness_rendering_of_the_run_it_names():
    """The README's speed table is benchmarks.readme_table's rendering of the run kept
    in benchmarks/readme_run.json: a figure typed by hand, or a table left behind by a
    newer run, fails here."""
    from benchmarks import readme_table
    block = readme_table.readme_block(README.read_text())
    assert block is not None, "the Speed section has lost its table markers"
    run = json.loads(readme_table.RUN_FILE.read_text())
    assert block == readme_table.render(run)
    assert "samples_us" not in readme_table.RUN_FILE.read_text()


def test_the_kept_run_holds_no_path_of_the_machine_it_ran_on():
    from benchmarks import readme_table
    run = {"meta": {"engine_source": {"path": "/somewhere/lcp_sandbox", "commit": "abc"}, "json_path": "/x/b.json"},
           "warm": {"split": {"sandbox": {"p50": 1.0, "samples_us": [1.0]}}}}
    kept = readme_table.summary(run)
    assert kept["meta"]["engine_source"] == {"commit": "abc"} and "json_path" not in kept["meta"]
    assert kept["warm"]["split"]["sandbox"] == {"p50": 1.0}
