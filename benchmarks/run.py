"""``python -m benchmarks.run``: the ``lcp-sandbox bench`` command (same options)."""
import sys

from lcp_sandbox.bench import main

if __name__ == "__main__":
    sys.exit(main())
