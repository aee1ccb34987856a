"""What every transformation of the offline catalog is: a class with a name, the bottlenecks it
addresses, and `propose`, which reads a `Context` (the variant's parsed source, its kernel and spec,
the kernel's tree, its latest profile) and returns the variants it makes, one `Rewrite` per choice of
its parameters. A transformation whose preconditions do not hold proposes nothing; one that proposes
wrong code is caught by the evaluation's checks, recorded, and never becomes a state of the search.

A transformation never runs code: it edits text on the tree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from optiml.cuda.kernel_ast import KernelAST
from optiml.cuda.source import Kernel, SourceFile
from optiml.expr import Expr as SizeExpr
from optiml.search.variant import Variant, launch_value, replace_kernel, set_spec_key
from optiml.spec import Spec, parse_spec

# Bottleneck kinds of `optiml.profile.model.Kind`, repeated here as plain strings so that the catalog
# can be used (and tested) with no profile at all.
MEMORY = frozenset({"dram", "l2", "l1_shared", "uncoalesced"})
LATENCY = frozenset({"latency", "occupancy", "small_grid"})
# Static shared memory a block may declare (more needs a dynamic allocation and an opt-in).
STATIC_SMEM = 48 * 1024


@dataclass
class Context:
    """Everything a transformation may read about the variant it edits."""

    variant: Variant
    source: SourceFile
    kernel: Kernel
    spec: Spec  # the variant's spec: the original contract with the variant's launch
    bottleneck: str | None = None  # the profile's diagnosis kind, if profiled
    profile: dict[str, Any] = field(default_factory=dict)  # the profile summary, if profiled
    sm_count: int = 132
    applied: tuple[str, ...] = ()  # names of the transformations on the path to this variant

    _ast: KernelAST | None = None

    @classmethod
    def of(cls, variant: Variant, path: str, kernel_name: str, **kw: Any) -> Context:
        source = variant.source(path)
        kernel = source.kernel(kernel_name)
        return cls(variant, source, kernel, parse_spec(source, kernel), **kw)

    @property
    def ast(self) -> KernelAST:
        if self._ast is None:
            self._ast = KernelAST(self.source, self.kernel)
        return self._ast

    @property
    def case(self):
        """The spec's first (main) problem size, evaluated."""
        return self.spec.case(self.spec.sizes[0])

    def env(self, case=None) -> dict[str, Any]:
        """What a spec expression may name at `case` (the main problem size by default): the file's
        constants and macros, the template's values, the sizes and the scalars."""
        case = case if case is not None else self.case
        return {**self.spec.constants, **self.spec.template_values, **case.sizes, **case.scalars}

    def value(self, text: str) -> int | float:
        """A spec expression (a size, a count) at the main problem size."""
        return SizeExpr.parse(text).evaluate(self.env())

    @property
    def comment(self) -> str:
        assert self.kernel.spec_comment is not None
        return self.kernel.spec_comment.text

    def float_tolerance(self) -> float:
        """The spec's relative tolerance for float outputs (the default for float if none)."""
        return self.spec.rtol if self.spec.rtol is not None else 1e-5

    # -- building proposals ---------------------------------------------------------------------

    def rewrite(
        self,
        definition: str | None = None,
        *,
        launch: tuple[list[str], list[str], str] | None = None,
        template: str | None = None,
        helpers: str = "",
        flags: tuple[str, ...] | None = None,
    ) -> Variant:
        """The variant with the kernel's definition, its launch (grid, block, smem expressions), its
        template instantiation, helper functions and flags replaced as given."""
        comment = self.comment
        if launch is not None:
            comment = set_spec_key(comment, "launch", launch_value(*launch))
        if template is not None:
            comment = set_spec_key(comment, "template", template)
        definition = definition if definition is not None else self.definition
        text = replace_kernel(
            self.source, self.kernel, definition, comment=comment, helpers=helpers
        )
        return Variant(text, flags if flags is not None else self.variant.flags)

    @property
    def definition(self) -> str:
        return self.source.text[self.kernel.span.start : self.kernel.span.end]

    @property
    def launch(self) -> tuple[list[str], list[str], str]:
        launch = self.spec.launch
        return list(launch.grid), list(launch.block), launch.smem


@dataclass(frozen=True)
class Rewrite:
    """One variant a transformation makes, for one choice of its parameters."""

    params: dict[str, Any]
    summary: str  # one line a CUDA developer reads on the edge of the search tree
    variant: Variant
    weight: float = 1.0  # the transformation's own preference among its parameter choices


class Transformation(ABC):
    """One kind of edit of the catalog. Subclasses set the class attributes and `propose`."""

    name: ClassVar[str]
    addresses: ClassVar[frozenset[str]]  # bottleneck kinds this edit is known to help with
    description: ClassVar[str]
    # Applied at most once on a path (adding `__restrict__` twice changes nothing).
    once: ClassVar[bool] = True
    # What a CUDA developer expects of it where it applies, as a factor of the prior: 1 for a
    # rewrite of how the kernel moves its data or shares its work (tiling, vectorizing, one warp
    # per row, privatizing, ...), 0.5 for a light touch that rarely moves a kernel far on its own
    # (qualifiers, launch bounds, unrolling, block size, fast math, a grid-stride loop).
    gain: ClassVar[float] = 1.0
    # Whether every load and store stays as the kernel has it (each thread's, of the same width, in
    # the same order): the only edits the offline policy makes of a kernel that reaches a
    # parameter's memory as `volatile` (`applies`), whose accesses may not be merged, widened,
    # staged or reordered.
    keeps_accesses: ClassVar[bool] = False

    def applies(self, ctx: Context) -> bool:
        """Whether the kernel is one this transformation may edit at all: not one with volatile
        global memory, unless it keeps every access as written."""
        return self.keeps_accesses or not ctx.ast.volatile_memory

    @abstractmethod
    def propose(self, ctx: Context) -> list[Rewrite]:
        """The variants this transformation makes of `ctx`'s kernel; [] if its preconditions fail."""
