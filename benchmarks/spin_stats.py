"""The sandbox's spin counters over the timed batches of the warm section (backends/local/spin.py)."""
from __future__ import annotations

from typing import Optional

_SPIN_COUNTS = ("host_hits", "host_misses", "worker_hits", "worker_misses", "off_busy")


def add_spin(acc: dict, key: str, before: Optional[dict], after: Optional[dict]) -> None:
    """Add what one timed batch did to the slot's spin counters (the warm-up excluded)."""
    if before is None or after is None:
        return
    tot = acc.setdefault(key, dict.fromkeys(_SPIN_COUNTS, 0))
    for k in _SPIN_COUNTS:
        tot[k] += after[k] - before[k]


def spin_summary(tot: dict) -> dict:
    """The counters and the share of waits each side's poll caught (backends/local/spin.py)."""
    def rate(hits: int, misses: int) -> Optional[float]:
        return hits / (hits + misses) if hits + misses else None
    return {**tot, "host_hit_rate": rate(tot["host_hits"], tot["host_misses"]),
            "worker_hit_rate": rate(tot["worker_hits"], tot["worker_misses"])}
