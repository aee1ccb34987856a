"""Lifting: what a kernel computes, as a model the host can run and the optimizer can read.

lifted = lift(source, kernel, spec)        # Lifted, or Unlifted with the lines and reasons
outputs = run(lifted, args, grid, block)   # NumPy, in float64 or the kernel's own types
report = describe(lifted)                  # accesses, reductions, domain, family
"""

from optiml.lift.model import Lifted, Unlifted
from optiml.lift.run import ModelError, run
from optiml.lift.symbolic import lift

__all__ = ["Lifted", "ModelError", "Unlifted", "lift", "run"]
