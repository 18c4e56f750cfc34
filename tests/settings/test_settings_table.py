"""docs/configuration.md's table of every setting is what the code says, and every setting
has a description (lcp_sandbox/fronts/settings_table.py makes the table from the code)."""
from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from lcp_sandbox import Limits, RaySupervisor, SandboxedBinding, Supervisor
from lcp_sandbox.fronts import settings_table as T

REGENERATE = f"run `{T.COMMAND}` and commit docs/configuration.md"


def test_the_page_holds_the_table_the_code_makes():
    page = T.PAGE.read_text(encoding="utf-8")
    table = T.page_table(page)
    assert table is not None, f"docs/configuration.md has lost its settings-table markers ({T.BEGIN})"
    try:
        made = T.render()
    except T.Missing as exc:
        pytest.fail(f"{exc}: describe it (DESCRIPTIONS in lcp_sandbox/fronts/settings_table.py, or the "
                    f"flag's help=), then {REGENERATE}")
    if table != made:
        old, new = set(table.splitlines()), set(made.splitlines())
        changed = "\n".join([*(f"- {line}" for line in sorted(old - new)),
                             *(f"+ {line}" for line in sorted(new - old))])
        pytest.fail(f"the settings table of docs/configuration.md is not what the code says; "
                    f"{REGENERATE}.\n{changed}")


def _rows() -> str:
    return T.render()


@pytest.mark.parametrize("cls", [SandboxedBinding, Supervisor, RaySupervisor], ids=lambda c: c.__name__)
def test_every_keyword_is_in_the_table(cls):
    table = _rows()
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name != "self":
            shown = "`**kwargs`" if p.kind is p.VAR_KEYWORD else f"`{name}`"
            assert f"| {shown} |" in table, f"{cls.__name__}({name}=...) is not in the table"


def test_every_sandbox_key_is_in_the_table_with_its_default():
    table = _rows()
    for field in dataclasses.fields(Limits):
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        assert f"| `{field.name}` | `{default!r}` |" in table, field.name


def test_every_serve_mcp_flag_is_in_the_table():
    table = _rows()
    for action in T.serve_mcp_parser()._actions:
        if not isinstance(action, argparse._HelpAction):
            shown = action.option_strings[-1] if action.option_strings else "FOLDER..."
            assert shown in table, shown


def test_a_setting_without_a_description_fails_and_names_the_command(monkeypatch, capsys):
    """What an engineer who adds a "sandbox" key (or a keyword, or a flag) sees."""
    described = {k: v for k, v in T.DESCRIPTIONS["sandbox"].items() if k != "network"}
    monkeypatch.setitem(T.DESCRIPTIONS, "sandbox", described)
    with pytest.raises(T.Missing, match="'network' has no description"):
        T.render()
    assert T.main([]) == 1
    assert "DESCRIPTIONS" in capsys.readouterr().err


def test_a_description_of_a_setting_that_is_gone_fails(monkeypatch):
    monkeypatch.setitem(T.DESCRIPTIONS, "Supervisor", {**T.DESCRIPTIONS["Supervisor"], "max_wrokers": "x"})
    with pytest.raises(T.Missing, match="max_wrokers"):
        T.render()


def test_a_flag_without_help_fails(monkeypatch):
    parser = T.serve_mcp_parser()
    parser.add_argument("--new-flag")
    monkeypatch.setattr(T, "serve_mcp_parser", lambda: parser)
    with pytest.raises(T.Missing, match="'--new-flag' has no help text"):
        T.render()


def test_a_machine_dependent_default_is_said_in_words():
    table = _rows()
    assert "| `--max-sessions N` | one per 32 MiB of memory, 16 to 4,096 |" in table


def test_write_puts_the_table_between_the_markers(tmp_path):
    page = tmp_path / "configuration.md"
    page.write_text(f"# Configuration\n\n{T.BEGIN}\nold\n{T.END}\n\nafter\n", encoding="utf-8")
    T.write(page)
    text = page.read_text(encoding="utf-8")
    assert T.page_table(text) == T.render() and text.endswith(f"{T.END}\n\nafter\n")
