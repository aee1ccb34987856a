"""Policies propose edits of a variant, each with a prior. The offline policy (the default, no LLM)
asks every transformation of the catalog and ranks what they make by the profile's diagnosis (an
edit known to address the variant's bottleneck first), by what the transformation has gained on
kernels of the variant's family (optiml/search/priors.py, learned from measurements; a rewrite
before a light touch where nothing was measured) and by the transformation's own ranking of its
parameters. A policy never runs code."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from optiml.search.catalog import CATALOG, Context, Transformation
from optiml.search.priors import family_of, gain
from optiml.search.trajectory import Edit, ProfileSummary
from optiml.search.variant import Variant

logger = logging.getLogger(__name__)

# How much more likely an edit is tried first when it addresses the diagnosed bottleneck.
MATCH, NO_PROFILE, MISMATCH = 3.0, 1.0, 0.4
JITTER = 0.1
FOUND_KEPT = 64  # nodes whose proposals the offline policy keeps
# A transformation that has not proposed within this many seconds is left behind (it runs on, on
# a daemon thread, until the process ends): a bug that never returns costs the search
# one transformation and a core, not the run. Proposals take well under a second as a rule.
PROPOSE_LIMIT_S = 60.0


@dataclass
class NodeView:
    """What a policy sees of a node: the variant, where it came from, and what is known of it."""

    variant: Variant
    path: str  # the user's file (compiler messages, includes)
    kernel: str
    applied: tuple[str, ...] = ()  # the transformations on the way to it
    profile: ProfileSummary | None = None
    # where `profile` is not the variant's own: the speedup of the kernel it comes from whose it is
    profile_from: float | None = None
    speedup: float | None = None
    sm_count: int = 132
    tried: set[str] = field(default_factory=set)  # edit keys its node already has


@dataclass(frozen=True)
class Candidate:
    edit: Edit
    prior: float
    variant: Variant


class Policy(Protocol):
    name: str

    async def propose(self, request: NodeView, k: int, rng: random.Random) -> list[Candidate]:
        """Edits of `request.variant`, best first (the search takes the first k new ones)."""
        ...


def _propose_all(
    catalog: dict[str, Transformation], names: list[str], ctx: Context, limit: float
) -> dict[str, object]:
    """Each named transformation's proposals for `ctx` (a list, the exception it raised, or
    `_LEFT`), asked in order on a daemon thread: where one has been at it for `limit` seconds, it
    is left behind with that thread and a new thread goes on from the next."""
    found: dict[str, object] = {}
    start = 0
    while start < len(names):
        mine: dict[str, object] = {}
        at: list = [None]  # (index, monotonic start) of the transformation being asked
        stop = threading.Event()
        done = threading.Event()

        def work(first: int = start, mine=mine, at=at, stop=stop, done=done) -> None:
            for i in range(first, len(names)):
                if stop.is_set():
                    return
                at[0] = (i, time.monotonic())
                t = catalog[names[i]]
                try:
                    mine[names[i]] = t.propose(ctx) if t.applies(ctx) else []
                except Exception as e:  # one transformation's bug must not end the search
                    mine[names[i]] = e
            done.set()

        threading.Thread(target=work, name="optiml-propose", daemon=True).start()
        while not done.wait(min(1.0, limit)):
            current = at[0]
            if current is not None and time.monotonic() - current[1] > limit:
                stop.set()
                i = current[0]
                found.update({n: mine[n] for n in names[start:i]})
                found[names[i]] = _LEFT
                start = i + 1
                break
        else:
            found.update(mine)
            start = len(names)
    return found


_LEFT = object()


class OfflinePolicy:
    """The catalog, ranked by the profile."""

    name = "offline"

    def __init__(self, catalog: dict[str, Transformation] | None = None):
        self.catalog = catalog if catalog is not None else CATALOG
        # A node is asked again for each child the search widens it by (a free slot's, one at a
        # time): the catalog's proposals for what it sees of the node are computed once.
        self._found: OrderedDict[tuple, list[Candidate]] = OrderedDict()

    async def propose(self, request: NodeView, k: int, rng: random.Random) -> list[Candidate]:
        # The catalog's proposals (lifting, rewriting) take a CPU for a while: on a thread, so
        # that the search's loop goes on recording the results of the evaluations in flight.
        key = (
            request.variant.key,
            request.path,
            request.kernel,
            request.applied,
            request.profile.model_dump_json() if request.profile else None,
            request.sm_count,
        )
        found = self._found.get(key)
        if found is None:
            found = await asyncio.to_thread(self.candidates, request)
            self._found[key] = found
            while len(self._found) > FOUND_KEPT:
                self._found.popitem(last=False)
        # A small seeded jitter breaks ties between equally ranked edits differently per seed.
        ranked = [
            Candidate(c.edit, c.prior * (1 + JITTER * rng.random()), c.variant) for c in found
        ]
        ranked.sort(key=lambda c: (-c.prior, c.edit.key))
        return ranked

    def candidates(self, request: NodeView) -> list[Candidate]:
        try:
            ctx = Context.of(
                request.variant,
                request.path,
                request.kernel,
                bottleneck=request.profile.bottleneck if request.profile else None,
                profile=request.profile.model_dump() if request.profile else {},
                sm_count=request.sm_count,
                applied=request.applied,
            )
        except Exception as e:  # a variant an LLM wrote may not parse: nothing to propose
            logger.info("no catalog proposals for a variant that does not parse: %s", e)
            return []
        family = family_of(request.variant.text, request.path, request.kernel)
        names = [n for n, t in self.catalog.items() if not (t.once and n in request.applied)]
        found = _propose_all(self.catalog, names, ctx, PROPOSE_LIMIT_S)
        out: list[Candidate] = []
        for name in names:
            t, proposals = self.catalog[name], found[name]
            if isinstance(proposals, Exception):
                logger.warning(
                    "transformation %s failed on %s: %s", name, request.kernel, proposals
                )
                continue
            if proposals is _LEFT:
                logger.error(
                    "transformation %s did not return within %.0f s on %s; going on without it",
                    name,
                    PROPOSE_LIMIT_S,
                    request.kernel,
                )
                continue
            assert isinstance(proposals, list)
            if request.profile is None:
                relevance = NO_PROFILE
            elif request.profile.bottleneck in t.addresses:
                relevance = MATCH
            else:
                relevance = MISMATCH
            for p in proposals:
                if p.variant.key == request.variant.key:
                    continue  # an edit that changes nothing
                edit = Edit(transform=name, params=p.params, summary=p.summary)
                prior = relevance * gain(family, name, t.gain) * p.weight
                out.append(Candidate(edit, prior, p.variant))
        out.sort(key=lambda c: (-c.prior, c.edit.key))
        return out
