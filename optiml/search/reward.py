"""The reward of a variant: the log of its speedup over the input (medians of one interleaved
measurement), plus small terms for the hardware moving the right way (fewer DRAM bytes, a busier
limiting unit), minus penalties for spills and an occupancy collapse. Noise-aware: a speedup inside
the measured spread counts as none. A wrong or broken variant has no reward (the search prunes it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optiml.search.trajectory import Measurement, ProfileSummary


@dataclass(frozen=True)
class RewardConfig:
    bytes_weight: float = 0.05  # per e-fold fewer DRAM bytes than the input moves
    sol_weight: float = 0.05  # per 100 points more speed-of-light of the limiting unit
    spill_penalty: float = 0.1
    occupancy_penalty: float = 0.05  # theoretical occupancy fell under a quarter of the input's
    min_noise: float = 0.01  # a relative spread below this is not trusted as measured


def reward(
    m: Measurement, baseline: Measurement | None, config: RewardConfig = RewardConfig()
) -> tuple[float | None, dict[str, float]]:
    """(reward, its terms); None for a variant that is not correct or was not timed."""
    if m.status != "ok" or not m.speedup or m.speedup <= 0:
        return None, {}
    terms: dict[str, float] = {}
    speed = math.log(m.speedup)
    noise = max(m.noise, config.min_noise)
    # Inside the noise, a variant is as fast as the input: prefer it only for its hardware terms.
    terms["log_speedup"] = 0.0 if abs(speed) <= noise else speed
    p, b = m.profile, baseline.profile if baseline else None
    if p is not None and b is not None:
        if p.dram_bytes and b.dram_bytes:
            terms["dram_bytes"] = config.bytes_weight * math.log(b.dram_bytes / p.dram_bytes)
        unit = _limiting(b)
        if unit is not None:
            before, after = getattr(b, unit), getattr(p, unit)
            if before is not None and after is not None:
                terms["sol"] = config.sol_weight * (after - before) / 100
        if (
            p.theoretical_occupancy_pct is not None
            and b.theoretical_occupancy_pct
            and p.theoretical_occupancy_pct < b.theoretical_occupancy_pct / 4
        ):
            terms["occupancy"] = -config.occupancy_penalty
    spills = (m.local_bytes or 0) > 0 or (p is not None and (p.local_sectors or 0) > 0)
    if spills and not (baseline and (baseline.local_bytes or 0) > 0):
        terms["spills"] = -config.spill_penalty  # a new spill, not one the input already had
    return sum(terms.values()), terms


def _limiting(p: ProfileSummary) -> str | None:
    """The speed-of-light figure of the unit that limits the input (memory or compute)."""
    if p.sol_memory_pct is None or p.sol_compute_pct is None:
        return None
    return "sol_memory_pct" if p.sol_memory_pct >= p.sol_compute_pct else "sol_compute_pct"


def is_improvement(m: Measurement, config: RewardConfig = RewardConfig()) -> bool:
    """Faster than the input beyond the measured spread."""
    if m.status != "ok" or not m.speedup:
        return False
    return math.log(m.speedup) > max(m.noise, config.min_noise)
