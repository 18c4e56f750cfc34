"""Every code block of README.md and of the guide (docs/*.md) runs as written.

Each block runs in a fresh folder laid out as a reader's checkout: a copy of the bundled
tools as ./tools and ./.venv, this interpreter's environment.  By language:

- python: run as a script.  A block whose first line is ``# file: PATH`` is a file the
  page's later blocks use: it is written at PATH in their folders (and compiled here).
- bash: one command a line (comments aside), run one after the other:
    ``lcp-sandbox ...`` (or ``.venv/bin/lcp-sandbox``): run with this environment's entry
        point, except ``serve-mcp``, which serves until it is stopped: only parsed here
        (tests/fronts/test_mcp_server.py runs the server);
    ``python3 -m venv .venv && .venv/bin/pip install ... && ...``: the extras it names
        exist; what the chain ends with is run (lcp-sandbox) or checked to exist (pytest).
        The README's first block is what CI itself runs (.ci/run);
    ``realpath ...``: run;
    ``python -m benchmarks ...`` and ``python -m benchmarks.readme_table ...`` (a full run
        takes minutes), ``python -m lcp_sandbox.fronts.settings_table --write`` (it writes
        into the checkout): parsed by their own parsers; the settings table without
        ``--write``: run;
    ``mkdocs build --strict``: run, into a temporary folder;
    ``npx @modelcontextprotocol/inspector [--cli] CMD ...`` (Node.js, fetched from npm: not
        here): CMD is an absolute path to lcp-sandbox whose arguments parse.
- json: MCP client configurations.  The command is an absolute path to lcp-sandbox and every
  path given to it is absolute; with this test folder's paths, the configuration starts a
  server from another folder ("/"), as a client would, which lists the tools and runs one.
- no language: the diagrams (DIAGRAMS, by page and section), checked to be them.
- yaml: Kubernetes manifests written out (docs/ray.md): each parses (a key given twice
  refused) into a document with its apiVersion, kind and metadata.name.
- console: docker and kubectl commands (docs/deploy.md), shown, not run (no container runtime
  here): tests/fronts/test_deploy.py checks them against deploy/.

EXPECTED_OUTPUT says what a block's run must print, by page and section, beyond exiting 0.
"""
from __future__ import annotations

import argparse
import importlib.metadata
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
from typing import Optional

import pytest
from conftest import REPO

from lcp_sandbox import __version__
from lcp_sandbox.fronts.cli import build_parser

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
BIN = Path(sys.executable).parent
ENTRY_POINT = BIN / "lcp-sandbox"
INSPECTOR = "@modelcontextprotocol/inspector"

# The fenced blocks that are not code: (page, section) -> words each must hold.
DIAGRAMS = {("internals.md", "How it is built"): ("host thread", "worker process"),
            ("network.md", "How it runs"): ("worker (its own network namespace", "SCM_RIGHTS"),
            ("network.md", "Without a network namespace: by port"): (
                "worker (the host's network)", "listener at 0.0.0.0:P"),
            ("environments.md", "Building"): ("first call of a library with a declaration",
                                              "complete in the store")}

# What a block's run must print, by (page, section) (beyond exiting 0).
EXPECTED_OUTPUT = {
    ("README.md", "With lollms"): ["'status_code': 200", "'success': True"],
    ("README.md", "Hosting many users"): ["'status_code': 200", "'privileges': 'uid "],
    ("README.md", "A library that calls one web API"): ["True\n", "policy (1 rules: own network"],
    ("quickstart.md", "A first binding"): ["'matches': ['sales.csv']", "Deleted 'sales.csv'",
                                           "'library': 'workspace_tools'"],
    ("lollms.md", "With lollms"): ["'status_code': 200", "'success': True"],
    ("writing-tools.md", "A library"): ["['title', 'text']", "'type': 'array'", "'saved_by_this_worker': 1",
                                        "todo.md exists", "1 notes in the workspace"],
    ("configuration.md", "Configuration"): ["'networks' is no sandbox setting (did you mean 'network'?)",
                                            "\n200\n"],
    ("results.md", "Results and failures"): ["tool_fail 500", "tool_sleep 504", "tool_hog 507",
                                             "tool_crash 500 [flaky] the worker running tool 'tool_crash' "
                                             "was killed by SIGSEGV", "tool_sleep 200 awake", "'restarts': 1"],
    ("hosting.md", "Hosting many users"): ["'alice': {'live_workers': 1", "['start', 'stop']"],
    ("security.md", "Security"): ["200\n", "env: clean (allowlist)", "privileges: uid ",
                                  "(did you mean 'mq_unlink'?)"],
    ("platforms.md", "Platforms and start methods"): ["200\n", "spawn fork-only"],
    ("network.md", "An example: a tool that calls one web API"): [
        "403: lcp-sandbox network policy: no allow rule matches 169.254.169.254:80", "policy (1 rules",
        "'refused': {'no allow rule': 1}"],
    ("ray.md", "More than one machine (Ray)"): ["'status_code': 200", "\nship\n",
                                                "'library': 'workspace_tools', 'calls': 2, 'node': '"],
}


@dataclass
class Block:
    page: Path
    lang: str
    code: str
    section: str
    line: int
    index: int

    @property
    def id(self) -> str:
        return f"{self.page.name}:{self.lang or 'text'}:{self.section}:{self.line}"

    @property
    def file(self) -> Optional[str]:
        """The path of a ``# file: PATH`` block (a file later blocks use), else None."""
        first = self.code.split("\n", 1)[0]
        return first[len("# file: "):].strip() if first.startswith("# file: ") else None


def page_blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    blocks, section, fence, lang, start, lines = [], "(top)", None, "", 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if fence is None:
            if line.startswith("#"):
                section = line.lstrip("#").strip()
            elif line.startswith("```"):
                fence, lang, start, lines = "```", line[3:].strip(), number, []
        elif line.startswith("```"):
            blocks.append(Block(page, lang, "\n".join(lines) + "\n", section, start, len(blocks)))
            fence = None
        else:
            lines.append(line)
    assert fence is None, f"{page.name}: the block opened on line {start} is never closed"
    return blocks


BLOCKS = [b for page in PAGES for b in page_blocks(page)]
README_BLOCKS = [b for b in BLOCKS if b.page == README]


def make_folder(path: Path, block: Block) -> Path:
    """A fresh folder as a reader's checkout has it: ./tools, ./.venv, and the files the
    page's earlier ``# file:`` blocks give."""
    shutil.copytree(REPO / "tools", path / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    (path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    for earlier in page_blocks(block.page)[:block.index]:
        if earlier.file:
            target = path / earlier.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(earlier.code, encoding="utf-8")
    return path


def test_the_pages_have_the_blocks_this_test_knows():
    langs: dict = {}
    for b in BLOCKS:
        langs.setdefault(b.lang, []).append((b.page.name, b.section))
    assert set(langs) == {"python", "bash", "", "json", "console", "yaml"}, langs
    assert sorted(langs[""]) == sorted(DIAGRAMS)                          # the diagrams: not code
    assert set(EXPECTED_OUTPUT) <= set(langs["python"]), set(EXPECTED_OUTPUT) - set(langs["python"])
    assert {p.name for p in PAGES} >= {"README.md", "index.md", "quickstart.md", "configuration.md"}


def test_the_diagrams_are_the_diagrams():
    for diagram in [b for b in BLOCKS if not b.lang]:
        for words in DIAGRAMS[(diagram.page.name, diagram.section)]:
            assert words in diagram.code, (diagram.id, words)


def test_every_page_is_in_the_site_nav():
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        assert f": {page.name}" in nav, f"docs/{page.name} is not in mkdocs.yml's nav"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "yaml"], ids=lambda b: b.id)
def test_yaml_block_is_a_manifest(block):
    from support import strict_yaml
    doc = strict_yaml.load(block.code)
    assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), doc
    assert doc["metadata"]["name"] and isinstance(doc["spec"], dict)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "python"], ids=lambda b: b.id)
def test_python_block_runs(block, tmp_path):
    if block.file:
        compile(block.code, block.file, "exec")            # run by the page's later blocks
        later = [b for b in page_blocks(block.page)[block.index + 1:] if b.lang == "python"]
        assert later, f"{block.id}: no later block of its page uses {block.file}"
        return
    if "lollms_client" in block.code and importlib.util.find_spec("lollms_client") is None:
        pytest.skip("this block needs lollms_client (the lollms or test extra)")
    if "RaySupervisor" in block.code and importlib.util.find_spec("ray") is None:
        pytest.skip("this block needs ray (the ray or test extra)")
    folder = make_folder(tmp_path, block)
    script = folder / "block.py"
    script.write_text(block.code, encoding="utf-8")
    # A block with RaySupervisor(address=None) would join this session's test cluster, if one
    # runs (tests/conftest.py ray_cluster): it gets a local Ray instance of its own instead.
    env = {**os.environ, "RAY_ADDRESS": "local"} if "RaySupervisor" in block.code else None
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=folder,
                       env=env)
    assert p.returncode == 0, f"{block.id}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    for expected in EXPECTED_OUTPUT.get((block.page.name, block.section), []):
        assert expected in p.stdout, (block.id, expected, p.stdout[-3000:])


def commands(block: Block) -> list[list[str]]:
    out = []
    for line in block.code.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            out.append(argv)
    return out


INSTALL = [b for b in README_BLOCKS if b.lang == "bash" and "pip install" in b.code]


def test_install_commands_are_what_ci_runs_and_end_in_commands_that_exist():
    """The README's install block is run by CI itself (.ci/run: venv, pip install -e ".[test]",
    the test command); here: what its commands end with exists in this environment."""
    assert len(INSTALL) == 1 and INSTALL[0] is README_BLOCKS[0], "the install block opens the README"
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


def test_each_reader_reaches_a_first_success_within_30_lines_of_the_readme():
    """A lollms user, an operator and an MCP user each read the README's opening (what it is,
    the install commands) and then their own section, to the end of its last code block
    before any other prose block: at most 30 lines in all."""
    lines = README.read_text(encoding="utf-8").splitlines()
    opening = next(i for i, line in enumerate(lines) if line.startswith("## "))
    for heading in ("## With lollms", "## Hosting many users", "## From an MCP client"):
        start = lines.index(heading)
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
        fences = [i for i in range(start, end) if lines[i].startswith("```")]
        assert fences, f"{heading}: no example"
        last = 1                      # the first block's closing fence, and the blocks that
        while last + 1 < len(fences) and not any(   # follow it with no prose between
                lines[i].strip() for i in range(fences[last] + 1, fences[last + 1])):
            last += 2
        read = opening + (fences[last] - start + 1)
        assert read <= 30, f"{heading}: a reader reaches the end of its example at line {read} of reading"


# ---------------------------------------------------------------- bash
def _extras() -> set:
    return set(importlib.metadata.metadata("lcp-sandbox").get_all("Provides-Extra") or ())


def _pip_install(args: list, where: str) -> None:
    assert args[:1] == ["install"], where
    extras = _extras()
    for arg in args[1:]:
        if arg in ("-e", "."):
            continue
        m = re.fullmatch(r"\.\[([\w,]+)\]", arg)
        assert m, f"{where}: pip installs the checkout ('.' or '.[extras]'), not {arg!r}"
        named = set(m.group(1).split(","))
        assert named <= extras, f"{where}: no extra {named - extras} (extras: {sorted(extras)})"


def _run_entry_point(argv: list, folder: Path, where: str) -> None:
    if argv[0] == "serve-mcp":                      # serves until stopped: only parsed
        build_parser().parse_args(argv)
        return
    p = subprocess.run([str(ENTRY_POINT), *argv], capture_output=True, text=True, timeout=120, cwd=folder)
    assert p.returncode == 0, f"{where}: {shlex.join(argv)}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    if argv[0] == "call":
        assert '"success": true' in p.stdout, p.stdout


def _segments(argv: list) -> list:
    """The commands of a line, split at ``&&``."""
    segments, current = [], []
    for word in argv:
        if word == "&&":
            segments.append(current)
            current = []
        else:
            current.append(word)
    return [*segments, current]


def _python_module(argv: list, folder: Path, where: str) -> None:
    module, args = argv[2], argv[3:]
    if module == "benchmarks":
        from benchmarks.cli import add_arguments
        parser = argparse.ArgumentParser(prog="python -m benchmarks")
        add_arguments(parser)
        parser.parse_args(args)
    elif module == "benchmarks.readme_table":
        from benchmarks import readme_table
        readme_table.build_parser().parse_args(args)
    elif module == "lcp_sandbox.fronts.settings_table":
        from lcp_sandbox.fronts import settings_table
        settings_table.build_parser().parse_args(args)
        if "--write" not in args:
            p = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=60, cwd=folder)
            assert p.returncode == 0 and p.stdout.startswith("| setting |"), (where, p.stderr[-2000:])
    else:
        raise AssertionError(f"{where}: no check for python -m {module}")


def _inspector(argv: list, folder: Path, where: str) -> None:
    assert argv[1] == INSPECTOR, where
    rest = [a.replace("$PWD", str(folder)) for a in argv[2:]]
    if rest[:1] == ["--cli"]:
        rest = rest[1:]
    while "--method" in rest:                        # the Inspector's own options, after the command
        i = rest.index("--method")
        del rest[i:i + 2]
    command, args = rest[0], rest[1:]
    assert os.path.isabs(command) and Path(command).name == "lcp-sandbox", (where, command)
    parsed = build_parser().parse_args(args)
    assert all(os.path.isabs(f) for f in parsed.folders), (where, parsed.folders)


def _mkdocs(argv: list, tmp: Path, where: str) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the docs or test extra)")
    p = subprocess.run([str(BIN / "mkdocs"), *argv[1:], "--site-dir", str(tmp / "site")], capture_output=True,
                       text=True, timeout=300, cwd=REPO, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert p.returncode == 0, f"{where}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"


def _run_command(argv: list, folder: Path, tmp: Path, where: str) -> None:
    program = Path(argv[0]).name
    if argv == ["python3", "-m", "venv", ".venv"]:
        return
    if argv[0] == ".venv/bin/pip":
        _pip_install(argv[1:], where)
    elif argv == [".venv/bin/python", "-m", "pytest", "-q"]:
        assert importlib.util.find_spec("pytest"), where
    elif argv[0] in ("lcp-sandbox", ".venv/bin/lcp-sandbox"):
        _run_entry_point(argv[1:], folder, where)
    elif argv[0] == "realpath":
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=folder)
        assert p.returncode == 0 and all(os.path.isabs(x) for x in p.stdout.split()), (where, p.stderr)
    elif argv[:2] == ["python", "-m"]:
        _python_module(argv, folder, where)
    elif program == "mkdocs":
        _mkdocs(argv, tmp, where)
    elif program == "npx":
        _inspector(argv, folder, where)
    else:
        raise AssertionError(f"{where}: not a command this test knows how to check")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "bash" and b not in INSTALL], ids=lambda b: b.id)
def test_bash_block_runs(block, tmp_path):
    folder = make_folder(tmp_path / "checkout", block)
    cmds = commands(block)
    assert cmds
    for line in cmds:
        for argv in _segments(line):
            _run_command(argv, folder, tmp_path, f"{block.id}: {shlex.join(argv)}")
    if "notes.txt" in block.code and any(c[1] == "call" for c in cmds if c[0] == "lcp-sandbox"):
        assert (folder / "ws" / "notes.txt").read_text() == "hi"     # the calls wrote, then read, in ./ws


# ---------------------------------------------------------------- json
_PATH_FLAGS = ("--workspace", "--workspace-root", "--config", "--token-file")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "json"], ids=lambda b: b.id)
def test_json_block_is_an_mcp_client_configuration_that_works_from_any_folder(block, tmp_path):
    config = json.loads(block.code)
    servers = list(config["mcpServers"].values())
    assert servers
    for server in servers:
        command, args = server["command"], server["args"]
        assert os.path.isabs(command) and Path(command).name == "lcp-sandbox", server
        assert args[0] == "serve-mcp", server
        parsed = build_parser().parse_args(args)
        paths = [*parsed.folders, *(getattr(parsed, f[2:].replace("-", "_")) for f in _PATH_FLAGS if f in args)]
        assert all(os.path.isabs(p) for p in paths), f"{block.id}: a client starts it elsewhere: {paths}"
        assert "--workspace" in args, f"{block.id}: over stdio the workspace is the client's folder"
        if importlib.util.find_spec("mcp") is None:
            continue
        folder = make_folder(tmp_path / "checkout", block)
        local = {**{f: str(folder / "tools") for f in parsed.folders},
                 parsed.workspace: str(tmp_path / "workspace")}
        _client_session([str(ENTRY_POINT), *[local.get(a, a) for a in args[1:]]], tmp_path / "workspace")


def _client_session(argv: list, workspace: Path) -> None:
    """Start the server as a desktop client does (from "/"), list the tools, write a file."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=argv[0], args=["serve-mcp", *argv[1:]], cwd="/")

    async def body():
        # errlog given: its default is the sys.stderr of the moment mcp.client.stdio was first
        # imported, which a test capturing its output (capsys) may have replaced by then
        with (workspace.parent / "server-stderr.log").open("w") as err:
            async with stdio_client(params, errlog=err) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                names = [t.name for t in (await session.list_tools()).tools]
                result = await session.call_tool("tool_write_file", {"file_name": "hello.txt", "content": "hi"})
                return names, result

    names, result = anyio.run(body)
    assert "tool_write_file" in names and not result.is_error, result
    assert (workspace / "hello.txt").read_text() == "hi"


# ---------------------------------------------------------------- the rest
def test_the_pages_mention_only_commands_the_cli_has():
    helps = subprocess.run([str(ENTRY_POINT), "--help"], capture_output=True, text=True, timeout=60).stdout
    used = set()
    for page in PAGES:
        used |= set(re.findall(r"(?:^|`)lcp-sandbox ([\w-]+)", page.read_text(encoding="utf-8"), flags=re.M))
    assert used and used <= {"tools", "call", "demo", "bench", "serve-mcp", "envs", "disks"}, used
    for name in used:
        assert f"    {name} " in helps, name


def test_the_speed_table_is_the_harness_rendering_of_the_run_it_names():
    """docs/performance.md's speed table is benchmarks.readme_table's rendering of the run
    kept in benchmarks/readme_run.json: a figure typed by hand, or a table left behind by a
    newer run, fails here."""
    from benchmarks import readme_table
    block = readme_table.readme_block(readme_table.PAGE.read_text())
    assert block is not None, "docs/performance.md has lost its speed-table markers"
    run = json.loads(readme_table.RUN_FILE.read_text())
    assert block == readme_table.render(run)
    assert "samples_us" not in readme_table.RUN_FILE.read_text()


def test_the_pages_agree_on_how_long_a_full_benchmark_run_takes():
    """docs/performance.md and benchmarks/README.md say the same "about N minutes", and it is
    the duration of the run the speed table shows, give or take half a minute."""
    from benchmarks import readme_table
    said = [re.findall(r"about ([\d.]+) minutes on 2 CPUs", page.read_text(encoding="utf-8"))
            for page in (readme_table.PAGE, REPO / "benchmarks" / "README.md")]
    assert all(len(s) == 1 for s in said) and said[0] == said[1], said
    minutes = json.loads(readme_table.RUN_FILE.read_text())["meta"]["duration_s"] / 60
    assert abs(float(said[0][0]) - minutes) <= 0.5, (said, minutes)


def test_the_kept_run_holds_no_path_of_the_machine_it_ran_on():
    from benchmarks import readme_table
    run = {"meta": {"engine_source": {"path": "/somewhere/lcp_sandbox", "commit": "abc"}, "json_path": "/x/b.json"},
           "warm": {"split": {"sandbox": {"p50": 1.0, "samples_us": [1.0]}}},
           "skipped": {"confined": 'RuntimeError: File "/home/me/lcp/benchmarks/confined.py", line 3'}}
    kept = readme_table.summary(run)
    assert kept["meta"]["engine_source"] == {"commit": "abc"} and "json_path" not in kept["meta"]
    assert kept["warm"]["split"]["sandbox"] == {"p50": 1.0}
    assert kept["skipped"]["confined"] == 'RuntimeError: File "confined.py", line 3'
    assert not re.search(r"(?<![\w.])/(?:[\w.-]+/)+", readme_table.RUN_FILE.read_text())


def test_the_changelog_has_this_version():
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{__version__}]" in text, f"CHANGELOG.md has no section for {__version__}"


def _anchors(page: Path) -> set:
    """The anchors of a page's headings, as GitHub and MkDocs make them."""
    out = set()
    for block_free in re.split(r"^```.*?^```", page.read_text(encoding="utf-8"), flags=re.S | re.M):
        for heading in re.findall(r"^#+ (.+)$", block_free, flags=re.M):
            out.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\- ]", "", heading.lower())).strip("-"))
    return out


def test_the_readme_links_lead_somewhere():
    """MkDocs checks the links of docs/ (mkdocs build --strict); the README's are checked here."""
    for target in re.findall(r"\]\(([^)\s]+)\)", README.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        page = REPO / path if path else README
        assert page.exists(), f"README.md links to {target}: no such file"
        if anchor:
            assert anchor in _anchors(page), f"README.md links to {target}: no such heading"
