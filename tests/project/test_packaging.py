"""What the built packages carry (CI builds them, installs each in a fresh virtualenv and runs
the demo: .ci/run); here, without building: the lists that decide it."""
from conftest import REPO


def test_every_bundled_library_is_a_package_of_the_wheel():
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    libraries = [d.name for d in (REPO / "tools").iterdir() if d.is_dir() and not d.name.startswith((".", "_"))]
    assert libraries
    for name in libraries:
        assert f'"lcp_sandbox.bundled_tools.{name}"' in pyproject, \
            f"tools/{name} is not in pyproject.toml's packages: the wheel would not carry it"


def test_the_sdist_carries_the_guide_the_tests_and_the_harness():
    manifest = (REPO / "MANIFEST.in").read_text(encoding="utf-8")
    for line in ("graft docs", "graft tests", "graft benchmarks", "include CHANGELOG.md mkdocs.yml .ci/run"):
        assert line in manifest, line
