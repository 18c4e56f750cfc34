"""Imports numpy at import (its OpenBLAS pool is a native thread managed across fork)."""
import os

import numpy as np


def tool_matmul(n: int = 8) -> dict:
    """A small matmul and a draw from numpy's global RNG."""
    a = np.ones((n, n))
    return {"success": True, "output": {"sum": float((a @ a).sum()), "draw": float(np.random.rand()),
                                        "pid": os.getpid()}}
