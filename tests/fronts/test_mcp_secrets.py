"""serve-mcp --secret: the values come from the environment or a file, never the command
line, and a mistake names the secret, never a value."""
import pytest

from lcp_sandbox.fronts.mcp_secrets import FILE_MAX, secret_values

VALUE = "sk-test-0123456789"


def test_values_from_the_environment_and_from_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_KEY", VALUE)
    (tmp_path / "key").write_text(VALUE + "\n")
    assert secret_values(["A=env:MY_KEY", f"B=file:{tmp_path / 'key'}"]) == {"A": VALUE,
                                                                           "B": VALUE}


@pytest.mark.parametrize("spec, said", [
    (f"A={VALUE}", "NAME=env:VARIABLE or NAME=file:PATH"),
    ("A", "NAME=env:VARIABLE"),
    ("A=env:NOT_SET_ANYWHERE", "'NOT_SET_ANYWHERE' is not set"),
    ("A=file:/nonexistent/key", "cannot be read"),
    ("BAD-NAME=env:MY_KEY", "not an environment variable's name"),
])
def test_a_mistake_names_the_secret_and_never_the_value(spec, said, monkeypatch):
    monkeypatch.setenv("MY_KEY", VALUE)
    with pytest.raises(ValueError) as refused:
        secret_values([spec])
    assert said in str(refused.value) and VALUE not in str(refused.value)


def test_a_name_twice_a_value_with_a_line_end_inside_and_a_big_file_are_refused(tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("MY_KEY", VALUE)
    with pytest.raises(ValueError, match="given twice"):
        secret_values(["A=env:MY_KEY", "A=env:MY_KEY"])
    (tmp_path / "two").write_text("line one\nline two\n")
    with pytest.raises(ValueError, match="control character") as refused:
        secret_values([f"A=file:{tmp_path / 'two'}"])
    assert "line one" not in str(refused.value)
    (tmp_path / "big").write_bytes(b"x" * (FILE_MAX + 1))
    with pytest.raises(ValueError, match="more than"):
        secret_values([f"A=file:{tmp_path / 'big'}"])
