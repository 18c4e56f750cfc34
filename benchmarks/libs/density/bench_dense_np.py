"""Density benchmark library that imports numpy (its workers fork from its template)."""
import numpy as np


def tool_dense_np_sum() -> dict:
    """Sums a tiny array with numpy.

    Returns:
        dict: {"sum": 6.0}
    """
    return {"sum": float(np.arange(4).sum())}
