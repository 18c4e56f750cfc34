"""Benchmarks of lcp_sandbox.

``python -m benchmarks.run [FOLDER] [--tool NAME --params JSON] ...`` is the same as
``lcp-sandbox bench``; a host benchmarks its own tools from Python with::

    from benchmarks import run_bench          # or: from lcp_sandbox.bench import run_bench
    result = run_bench("./my_tools", "tool_search", {"query": "x"}, quick=True,
                       json_path="bench.json", plot_path="bench.png", out=sys.stdout)

``libs/`` holds the benchmark's own tool libraries (``bench_noop``, ``bench_heavy``).
See README.md here for what each row means.
"""
from lcp_sandbox.bench import BenchConfig, render_table, run_bench, write_plot

__all__ = ["BenchConfig", "run_bench", "render_table", "write_plot"]
