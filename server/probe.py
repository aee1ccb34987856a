"""A loop-lag probe for benchmarks: with OPTIML_LSP_PROBE=1 in its environment the server times
how late a 1 ms timer fires, and answers the request `optiml/loopLag` with the worst and the
99th-percentile lag since the last such request."""

from __future__ import annotations

import asyncio
import time

ENV = "OPTIML_LSP_PROBE"
METHOD = "optiml/loopLag"
_INTERVAL_S = 0.001


class LoopLag:
    def __init__(self) -> None:
        self._lags: list[float] = []

    async def run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(_INTERVAL_S)
            self._lags.append(time.perf_counter() - start - _INTERVAL_S)

    def take(self) -> dict[str, float]:
        lags, self._lags = sorted(self._lags), []
        if not lags:
            return {"samples": 0, "max_ms": 0.0, "p99_ms": 0.0}
        return {
            "samples": len(lags),
            "max_ms": lags[-1] * 1e3,
            "p99_ms": lags[min(len(lags) - 1, int(len(lags) * 0.99))] * 1e3,
        }
