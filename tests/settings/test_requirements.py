"""A library's requirements are names from the host's index, and nothing else.

The attacker is a library (or whoever writes a host's settings from a library's word) that
names a wheel it should not have: by its file name (read from the host's working folder),
by a path through ``../``, by a ``file:`` URL, with or without a marker, in each place a
requirement is read.  Each is refused with a 500 naming it; nothing is built.  The host's
index here is a folder without ``alpha``; the attacker's ``alpha`` lies elsewhere.
"""
from pathlib import Path

import pytest
from support.envs_support import VERSION_TOOL, library, offline_uv, script_block, wheel

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.envs import Store
from lcp_sandbox.backends.envs.build import BuildFailed, uv_lines
from lcp_sandbox.core.requirements import DeclarationError, declared, normalise, requirement

WHEEL = "alpha-1.0-py3-none-any.whl"
MARKER = "; python_version >= '3'"


@pytest.fixture
def places(open_tmp, tmp_path):
    """The host's index (no alpha), the attacker's folder (alpha 1.0, and a folder in it), and
    uv pointed at the index only."""
    index, elsewhere = open_tmp / "index", open_tmp / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    index.mkdir()
    wheel(index, "five0", "1.0", "N = 0\n")
    wheel(elsewhere, "alpha", "1.0", "V = '1.0'\n")
    with offline_uv(index, tmp_path / "uv-cache"):
        yield {"index": index, "elsewhere": elsewhere, "store": tmp_path / "store"}


def attacks(elsewhere: Path) -> dict[str, tuple[str, str]]:
    """name -> (the requirement, why it is refused)."""
    plain = {"file name": (WHEEL, "a file's name, not a project's"),
             "../ path": (f"sub/../{WHEEL}", "a path"),
             "file: URL": (f"file:{elsewhere}/{WHEEL}", "a URL"),
             "relative file: URL": (f"file:sub/../{WHEEL}", "a URL")}
    return {**plain, **{f"{name} with a marker": (req + MARKER, why)
                        for name, (req, why) in plain.items()}}


def declared_as(place: str, folder: Path, req: str) -> tuple[dict, Path]:
    """A library whose one requirement is ``req``, declared in ``place``: its binding's
    host_tool_configs and its tools folder."""
    tools = folder / "tools"
    if place == "host":
        library(tools, "lib", VERSION_TOOL.format(name="x"))
        return {"lib": {"sandbox": {"requirements": [req]}}}, tools
    if place == "pep723":
        library(tools, "lib", VERSION_TOOL.format(name="x"), script_block(req))
    else:
        library(tools, "lib", VERSION_TOOL.format(name="x"), requirements_txt=req + "\n")
    return {}, tools


@pytest.mark.parametrize("attack", list(attacks(Path("/x"))))
@pytest.mark.parametrize("place", ["host", "pep723", "requirements.txt"])
def test_a_requirement_that_is_a_path_installs_nothing(places, tmp_path, monkeypatch, place,
                                                       attack):
    req, why = attacks(places["elsewhere"])[attack]
    configs, tools = declared_as(place, tmp_path, req)
    # (a relative path is read against the host's working folder)
    monkeypatch.chdir(places["elsewhere"])
    with Supervisor(envs_dir=str(places["store"])) as sup, \
            SandboxedBinding(configs, tools_folders=[tools], supervisor=sup,
                             workspace=tmp_path) as b:
        out = b.execute_tool("tool_x", {})
        assert out["status_code"] == 500 and not out["success"], out
        assert "[lib] not run: its dependencies cannot be read" in out["error"], out
        assert f"{req!r} is not a requirement from an index ({why}" in out["error"], out
        assert sup.metrics()["env_builds"]["ok"] == 0
    assert Store(str(places["store"])).entries() == []


def test_a_uv_toml_in_the_hosts_folder_or_above_the_store_points_nowhere(places, tmp_path,
                                                                        monkeypatch):
    # The host's working folder (the default workspace of its tools) holds a uv.toml that
    # names the attacker's folder; the store lies below it too.
    evil = places["elsewhere"].parent / "cwd"
    evil.mkdir()
    (evil / "uv.toml").write_text(f'find-links = ["{places["elsewhere"]}"]\n')
    monkeypatch.chdir(evil)
    configs, tools = declared_as("pep723", tmp_path, "alpha==1.0")
    with Supervisor(envs_dir=str(evil / "store")) as sup, \
            SandboxedBinding(configs, tools_folders=[tools], supervisor=sup,
                             workspace=tmp_path) as b:
        out = b.execute_tool("tool_x", {})
        assert out["status_code"] == 500, out
        assert "alpha" in out["error"] and "uv pip compile said" in out["error"], out


def test_requirements_are_kept_in_one_spelling_and_the_rest_is_refused_by_name():
    assert normalise(["Alpha_X [Fast , b] >=1.0,<2 ; python_version>'3.8'", "c  <2", "c<2",
                      " "]) == ('alpha-x[b,fast]<2,>=1.0; python_version > "3.8"', "c<2")
    assert requirement("A.B==1.0") == "a-b==1.0"
    refused = {WHEEL: "a file's name", "pkg.tar.gz": "a file's name",
               "../x.whl": "a path", "sub/../x.whl": "a path", "~/x.whl": "a path",
               "/abs/x.whl": "a path", "C:\\x.whl": "a path",
               "file:///tmp/x.whl": "a URL", "file:/tmp/x.whl": "a URL",
               "FILE:x.whl": "a URL", "https://e.example/x.whl": "a URL",
               "git+https://e.example/x": "a URL",
               "x @ file:///tmp/x.whl": "a direct reference",
               "x@https://e.example/x.whl ; python_version > '3'": "a direct reference",
               "-e .": "an option", "-r other.txt": "an option",
               "--index-url https://e.example/simple": "an option",
               "x --config-settings=a=b": "an option", "x --hash=sha256:00": "an option",
               "x; platform_release == '${HOME}'": "holds '$'",
               "x===${HOME}": "holds '$'",
               "x; platform_version == '#1'": "holds '#'",
               "x; platform_version == 'a\\\\'": "holds '\\\\'"}
    for text, why in refused.items():
        with pytest.raises(DeclarationError) as got:
            normalise([text], "where.py")
        spelled = " ".join(text.split())
        assert f"where.py: {spelled!r} is not a requirement from an index (" in str(got.value)
        assert why in str(got.value), (text, str(got.value))


def test_uv_reads_each_requirement_in_its_one_spelling_or_nothing():
    assert uv_lines(["Alpha_X[Fast]>=1", "b"]) == "alpha-x[fast]>=1\nb\n"
    with pytest.raises(BuildFailed, match="a file's name"):
        uv_lines(["b", WHEEL])


@pytest.mark.parametrize("name, text, said", [
    ("lib.py", '# /// script\n# dependencies = ["five0"]\n# dependencies = ["alpha"]\n# ///\n',
     "Cannot overwrite a value (at line 2"),
    ("pyproject.toml", '[project]\nname = "lib"\ndependencies = ["five0"]\n'
                       'dependencies = ["alpha"]\n', "Cannot overwrite a value (at line 4"),
    ("pyproject.toml", '[project]\ndependencies = ["five0"]\n[project]\n'
                       'dependencies = ["alpha"]\n', "Cannot declare ('project',) twice (at line 3"),
    ("pyproject.toml", '[project]\ndependencies = ["five0"]\n[tool.x]\ny = 1\n'
                       '[project]\nname = "lib"\n', "Cannot declare ('project',) twice (at line 5"),
], ids=["script-block", "pyproject-key", "pyproject-table", "pyproject-table-apart"])
def test_a_toml_declaration_that_gives_a_key_twice_is_refused_naming_the_file(tmp_path, name,
                                                                               text, said):
    """TOML forbids a key or a table given twice, and tomllib (tomli on 3.10) refuses it:
    a second ``dependencies`` is never read as the last."""
    folder = tmp_path / "lib"
    folder.mkdir()
    primary = folder / "lib.py"
    primary.write_text((text if name == "lib.py" else "") + "def tool_x() -> int:\n    return 1\n")
    if name != "lib.py":
        (folder / name).write_text(text)
    with pytest.raises(DeclarationError) as caught:
        declared([str(primary)], str(folder))
    assert str(caught.value).startswith(f"{folder / name} is not valid TOML: {said}"), caught.value
