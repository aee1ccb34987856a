"""The work a case must do, from the spec and what was observed of the candidate: the fewest bytes
of DRAM traffic any launch of it needs. Under the measured bandwidth ceiling that is a physical
floor on its time (`ceilings.floor_of`); a time below it means work was skipped.

The bound is built so that no honest kernel can be under it:
- every timed launch gets fresh inputs and follows an L2 flush, so an input element the outputs
  depend on must be read from DRAM at that launch; which elements they depend on is probed (the
  runner's dependence probes: an element set to an extreme value, the outputs compared): a buffer
  all of whose probed elements mattered counts whole, a partly sampled one at half its observed
  fraction, one not probed not at all (a gather's table is read only where it is indexed); a
  probed element of an `inout` buffer that the launch leaves as the probe wrote it (a scatter's
  untouched row) does not count, as the kernel need neither read nor write it;
- every element of an `out` buffer must be written (the harness poisons them before each launch),
  but writes may stay in the L2 past the launch: only what exceeds the L2's size counts.
FLOPs are not counted: no FLOP model of an arbitrary kernel is known here.
"""

from __future__ import annotations

from optiml.cuda.types import DTYPES
from optiml.harness.verdict import Dependence
from optiml.spec import Case, Spec


def read_fraction(d: Dependence | None) -> float:
    """What share of a buffer's bytes counts as necessarily read."""
    if d is None or d.samples == 0:
        return 0.0
    if d.sensitive == d.samples:
        return 1.0
    return 0.5 * d.sensitive / d.samples


def least_bytes(spec: Spec, case: Case, dependence: list[Dependence], l2_bytes: int) -> int:
    probed = {d.buffer: d for d in dependence}
    reads = 0.0
    writes = 0
    for b in spec.buffers:
        size = case.lengths[b.name] * DTYPES[b.dtype].size
        if b.role == "out":
            writes += size
        else:
            reads += size * read_fraction(probed.get(b.name))
    return int(reads) + max(0, writes - l2_bytes)


def moved_bytes(spec: Spec, case: Case, dependence: list[Dependence]) -> int:
    """What the operation moves at `case` when bound by memory, the floor a fast kernel is held
    to (not a bound no honest kernel is under, as `least_bytes` is): every output and `inout`
    buffer written once, and every input read once — as much of it as the outputs were seen to
    depend on (a gather reads the rows it looks up, not its whole table)."""
    probed = {d.buffer: d for d in dependence}
    total = 0.0
    for b in spec.buffers:
        size = case.lengths[b.name] * DTYPES[b.dtype].size
        if b.role != "out":
            # a probe that saw no output move (one element rarely moves a maximum) cannot say
            # how much is read: all of it, as a reduction does
            d = probed.get(b.name)
            total += size * (read_fraction(d) if d is not None and d.sensitive else 1.0)
        if b.role != "in":
            total += size
    return int(total)
