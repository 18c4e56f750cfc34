"""Benchmarks of lcp_sandbox (a source checkout's folder, not part of the installed package).

``python -m benchmarks [FOLDER] [--tool NAME --params JSON] ...`` is the same as
``lcp-sandbox bench`` (``python -m benchmarks.run`` too); a host benchmarks its own
tools from Python with::

    from benchmarks import run_bench
    result = run_bench("./my_tools", "tool_search", {"query": "x"}, quick=True,
                       json_path="bench.json", plot_path="bench.png", out=sys.stdout)

``libs/`` holds the benchmark's own tool libraries (``bench_noop``, ``bench_heavy``).
See README.md here for what each row means, runner.py for how the modules fit.
It uses only the public API of lcp_sandbox.
"""
from importlib import import_module
from typing import Any

_EXPORTS = {"BenchConfig": "config", "run_bench": "runner", "render_table": "report", "write_plot": "report"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Imported on first use: ``lcp-sandbox`` registers ``bench`` without loading the harness."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'benchmarks' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
