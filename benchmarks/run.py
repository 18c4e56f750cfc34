"""``python -m benchmarks.run``: an alias of ``python -m benchmarks``."""
import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks", run_name="__main__", alter_sys=True)
