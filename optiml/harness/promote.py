"""The original kernel as a higher-precision oracle: the same code with its floating-point types
promoted to double.

A rewrite that adds in another order (a block reduction instead of same-address float atomics, a
warp per row instead of one thread's loop) can be closer to the exact result than the kernel it
replaces, and a check against that kernel with a float tolerance calls it wrong. Against the kernel
computed in double, the original and the rewrite each show their own rounding error, and a rewrite
no less accurate than the original can be accepted.

`promote_to_double` copies the kernel, and the device functions, templates, types and constants of
the same file that it reaches, into a namespace `optiml_f64` inserted right after the kernel:
everything the kernel sees is declared before the copy, the original stays as written, and the file
compiles as one translation unit. Macros it reaches whose text changes are redefined around the
copy (`push_macro` / `pop_macro`). In the copies, on the tree:

- `float`, `half`, `__nv_bfloat16` become `double`; `float2`/`float4` become `double2`/`double4`;
- float literals lose their suffix (`1e-5f` -> `1e-5`); `FLT_MAX` becomes `DBL_MAX`;
- single-precision math functions and intrinsics become their double forms (`expf` -> `exp`,
  `__fdividef(a, b)` -> `((a) / (b))`, `__saturatef(x)` -> `fmin(fmax(x, 0.0), 1.0)`); half
  conversions and arithmetic become plain double arithmetic (`__half2float(x)` -> `(x)`);
- `atomicAdd` on float memory becomes the double `atomicAdd` (sm_60 and later).

Where the code's meaning depends on float's 32 bits (bit reinterpretation, pointer casts between
float and other memory, inline PTX, float atomics other than addition, packed `half2`) or on code
this file does not show (a function or type declared elsewhere), it gives up with the reasons
(`NotPromotable`). The copy is compiled: doubled shared-memory arrays may no longer fit a block.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from tree_sitter import Node

from optiml.cuda.kernel_ast import KernelAST
from optiml.cuda.source import Kernel, SourceFile
from optiml.cuda.types import DTYPES, lookup
from optiml.spec import BufferArg, ScalarArg, Spec

logger = logging.getLogger(__name__)

NAMESPACE = "optiml_f64"
DEFAULT_ARCH = "sm_90"
STATIC_SMEM_LIMIT = 48 * 1024  # static shared memory a block may declare
SMEM_LIMIT = 227 * 1024  # shared memory of a block on sm_90, static and dynamic together

# ---- what becomes what ------------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    """A table of names written as words, a line of them at a time."""
    return frozenset(text.split())


HALF_TYPES = frozenset({"half", "__half", "__nv_bfloat16", "nv_bfloat16"})
VECTOR_TYPES = {f"float{n}": f"double{n}" for n in (1, 2, 3, 4)}
PACKED_TYPES = frozenset({"half2", "__half2", "__nv_bfloat162", "nv_bfloat162"})

_ROUNDINGS = ("rn", "rz", "ru", "rd")
# Double-precision math functions whose single-precision form is the same name with an `f`.
DOUBLE_MATH = _words(
    """acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh cospi cyl_bessel_i0
    cyl_bessel_i1 erf erfc erfcinv erfcx erfinv exp exp10 exp2 expm1 fabs fdim floor fma fmax
    fmin fmod frexp hypot ilogb j0 j1 jn ldexp lgamma llrint llround log log10 log1p log2 logb
    lrint lround modf nan nearbyint nextafter norm norm3d norm4d normcdf normcdfinv pow rcbrt
    remainder remquo rhypot rint rnorm rnorm3d rnorm4d round rsqrt scalbln scalbn sin sincos
    sincospi sinh sinpi sqrt tan tanh tgamma trunc y0 y1 yn"""
)
_CUDART_PAIRS = _words(
    """INF NAN MIN_DENORM NEG_ZERO ZERO ONE SQRT_HALF SQRT_HALF_HI SQRT_HALF_LO SQRT_TWO THIRD PIO4
    PIO2 3PIO4 2_OVER_PI PI L2E L2T LG2 LGE LN2 LNT LNPI TRIG_PLOSS"""
)
_M_CONSTANTS = _words("E LOG2E LOG10E LN2 LN10 PI PI_2 PI_4 1_PI 2_PI 2_SQRTPI SQRT2 SQRT1_2")
# Names replaced wherever they stand: functions, intrinsics and constants with a double form.
RENAMES: dict[str, str] = {
    **{f"{name}f": name for name in DOUBLE_MATH},
    **{f"__{name}f": name for name in _words("exp exp10 log log2 log10 sin cos tan tanh pow")},
    "__sincosf": "sincos",
    **{f"__fsqrt_{r}": "sqrt" for r in _ROUNDINGS},
    **{f"__fmaf_{r}": "fma" for r in _ROUNDINGS},
    "__frsqrt_rn": "rsqrt",
    **{f"make_float{n}": f"make_double{n}" for n in (1, 2, 3, 4)},
    **{
        f"__{source}2{target}_{r}": f"__double2{target}_{r}"
        for source in ("float", "half", "bfloat16")
        for target in ("int", "uint", "ll", "ull")
        for r in _ROUNDINGS
    },
    # cuda_fp16.h and cuda_bf16.h math
    **{f"h{name}": name for name in _words("exp exp2 exp10 log log2 log10 sqrt rsqrt sin cos")},
    **{f"h{name}": name for name in _words("tanh floor ceil trunc rint")},
    **{"__habs": "fabs", "__hmax": "fmax", "__hmin": "fmin", "__hfma": "fma"},
    **{"__hisnan": "isnan", "__hisinf": "isinf"},
    # constants
    **{f"FLT_{c}": f"DBL_{c}" for c in ("MAX", "MIN", "EPSILON", "TRUE_MIN")},
    "HUGE_VALF": "HUGE_VAL",
    **{f"M_{c}f": f"M_{c}" for c in _M_CONSTANTS},
    **{f"CUDART_{c}_F": f"CUDART_{c}" for c in _CUDART_PAIRS},
}
_HALF_ARITHMETIC = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_HALF_COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_FLOAT_ARITHMETIC = {"fadd": "+", "fsub": "-", "fmul": "*", "fdiv": "/"}
# Calls rebuilt from their (rewritten) arguments: name -> (number of arguments, format).
CALL_FORMS: dict[str, tuple[int, str]] = {
    **{
        f"__{op}_{r}": (2, f"(({{0}}) {sym} ({{1}}))")
        for op, sym in _FLOAT_ARITHMETIC.items()
        for r in _ROUNDINGS
    },
    **{f"__frcp_{r}": (1, "(1.0 / ({0}))") for r in _ROUNDINGS},
    "__fdividef": (2, "(({0}) / ({1}))"),
    "fdividef": (2, "(({0}) / ({1}))"),
    "__saturatef": (1, "fmin(fmax({0}, 0.0), 1.0)"),
    # half and bfloat16: a conversion is the value itself, arithmetic is double arithmetic
    **{
        name: (1, "({0})")
        for name in (
            "__half2float",
            "__bfloat162float",
            "__float2half",
            "__float2bfloat16",
            *(f"__float2{half}_{r}" for half in ("half", "bfloat16") for r in _ROUNDINGS),
        )
    },
    **{
        f"__{integer}2{target}_{r}": (1, "((double)({0}))")
        for integer in ("int", "uint", "ll", "ull", "short", "ushort")
        for target in ("float", "half", "bfloat16")
        for r in _ROUNDINGS
    },
    **{f"__h{op}": (2, f"(({{0}}) {sym} ({{1}}))") for op, sym in _HALF_ARITHMETIC.items()},
    **{f"__h{op}_rn": (2, f"(({{0}}) {sym} ({{1}}))") for op, sym in _HALF_ARITHMETIC.items()},
    **{f"__h{op}": (2, f"(({{0}}) {sym} ({{1}}))") for op, sym in _HALF_COMPARISONS.items()},
    "__hneg": (1, "(-({0}))"),
    "hrcp": (1, "(1.0 / ({0}))"),
}
# Calls whose result depends on a float's bits, or that pack two halves: nothing in double means
# the same.
BIT_CASTS = _words(
    """__float_as_int __float_as_uint __int_as_float __uint_as_float __half_as_short
    __half_as_ushort __short_as_half __ushort_as_half __bfloat16_as_short __bfloat16_as_ushort
    __short_as_bfloat16 __ushort_as_bfloat16 bit_cast __builtin_bit_cast __float2half2_rn
    __floats2half2_rn __float22half2_rn __halves2half2"""
)
FLOAT_ADDS = frozenset({"atomicAdd", "atomicAdd_block", "atomicAdd_system"})
OTHER_ATOMICS = frozenset(
    f"atomic{op}{scope}"
    for op in ("Sub", "Exch", "Min", "Max", "Inc", "Dec", "CAS", "And", "Or", "Xor")
    for scope in ("", "_block", "_system")
)
# Calls that mean the same with double arguments (overloaded, or not about floats at all).
KNOWN_CALLS = (
    DOUBLE_MATH
    | FLOAT_ADDS
    | OTHER_ATOMICS
    | _words(
        """__syncthreads __syncthreads_count __syncthreads_and __syncthreads_or __syncwarp
        __threadfence __threadfence_block __threadfence_system __shfl_sync __shfl_up_sync
        __shfl_down_sync __shfl_xor_sync __ballot_sync __any_sync __all_sync __activemask
        __match_any_sync __match_all_sync __reduce_add_sync __reduce_min_sync __reduce_max_sync
        __reduce_and_sync __reduce_or_sync __reduce_xor_sync __popc __popcll __clz __clzll __ffs
        __ffsll __brev __brevll __byte_perm __mul24 __umul24 __mulhi __umulhi __mul64hi
        __umul64hi __sad __usad __funnelshift_l __funnelshift_lc __funnelshift_r
        __funnelshift_rc __nanosleep clock clock64 __ldg __ldcg __ldca __ldcs __ldlu __ldcv
        __stcg __stcs __stwb __stwt __isGlobal __isShared __cvta_generic_to_shared __assume
        __builtin_assume __builtin_expect __builtin_unreachable __trap __brkpt printf assert min
        max umin umax llmin llmax ullmin ullmax abs labs llabs isnan isinf isfinite signbit
        __double2int_rn __double2int_rz __double2uint_rn __double2uint_rz __double2ll_rn
        __double2ll_rz __double2ull_rn __double2ull_rz __dadd_rn __dmul_rn __dsub_rn __ddiv_rn
        __drcp_rn __dsqrt_rn __fma_rn __double_as_longlong __longlong_as_double dim3"""
    )
    | {
        f"make_{t}{n}"
        for t in _words("double int uint char uchar short ushort long ulong")
        for n in (1, 2, 3, 4)
    }
)
CASTS = frozenset({"static_cast", "reinterpret_cast", "const_cast", "dynamic_cast"})
# Names of the CUDA runtime, its headers and the C library that mean the same in double.
KNOWN_NAMES = _words(
    """threadIdx blockIdx blockDim gridDim warpSize NULL INFINITY NAN HUGE_VAL DBL_MAX DBL_MIN
    DBL_EPSILON DBL_TRUE_MIN INT_MAX INT_MIN UINT_MAX LONG_MAX LONG_MIN ULONG_MAX LLONG_MAX
    LLONG_MIN ULLONG_MAX SHRT_MAX SHRT_MIN USHRT_MAX CHAR_BIT CHAR_MAX SCHAR_MAX UCHAR_MAX
    __CUDA_ARCH__ __CUDACC__ __LINE__ __FILE__ __func__"""
) | {f"M_{c}" for c in _M_CONSTANTS}
KNOWN_TYPES = frozenset(
    {"dim3", "size_t", "ptrdiff_t", "intptr_t", "uintptr_t", "double4_16a", "double4_32a"}
    | {f"{sign}int{bits}_t" for sign in ("", "u") for bits in (8, 16, 32, 64)}
    | {
        f"{base}{n}"
        for base in _words("char uchar short ushort int uint long ulong longlong ulonglong double")
        for n in (1, 2, 3, 4)
    }
    | {"thread_block", "thread_block_tile", "grid_group", "coalesced_group", "thread_group"}
)
COOPERATIVE_GROUPS = "cooperative_groups"
CG_NAMES = _words(
    """this_thread_block this_grid this_thread tiled_partition coalesced_threads labeled_partition
    binary_partition reduce inclusive_scan exclusive_scan plus less greater bit_and bit_or
    bit_xor sync thread_block thread_block_tile grid_group coalesced_group thread_group"""
)
CG_METHODS = _words(
    """sync thread_rank size num_threads meta_group_rank meta_group_size group_index thread_index
    group_dim dim_threads num_blocks block_rank block_index shfl shfl_up shfl_down shfl_xor any
    all ballot match_any match_all is_valid"""
)
STD_NAMES = DOUBLE_MATH | _words(
    "min max abs swap clamp numeric_limits isnan isinf isfinite signbit"
)

# ---- the tree's shapes ---------------------------------------------------------------------------

# Declarator wrappers between a declaration and the name it declares.
_DECLARATORS = frozenset(
    {
        "init_declarator",
        "pointer_declarator",
        "array_declarator",
        "reference_declarator",
        "parenthesized_declarator",
        "attributed_declarator",
    }
)
_DECLARING = frozenset(
    {
        "declaration",
        "parameter_declaration",
        "optional_parameter_declaration",
        "field_declaration",
        "for_range_loop",
    }
)
_TYPE_SPECIFIERS = frozenset(
    {"struct_specifier", "class_specifier", "union_specifier", "enum_specifier"}
)
_NOT_CODE = frozenset({"comment", "string_literal", "char_literal", "raw_string_literal"})
# Kinds of namespace-scope declarations that the copy holds (rewritten) when the kernel reaches them.
_COPIED = frozenset({"function", "type", "constant", "shared", "kernel"})
_VARIABLES = frozenset({"constant", "shared", "constant_memory", "device_variable"})
_KIND_NAMES = {
    "function": "functions",
    "type": "types",
    "constant": "constants",
    "shared": "shared arrays",
}


class NotPromotable(Exception):
    """The kernel's code does not allow a double-precision copy; `reasons` says why."""

    def __init__(self, reasons: list[str] | str):
        self.reasons = [reasons] if isinstance(reasons, str) else list(dict.fromkeys(reasons))
        super().__init__("; ".join(self.reasons))


@dataclass(frozen=True)
class Promoted:
    """A file holding the original kernel and its double-precision copy, and how to launch it."""

    source: SourceFile  # the original file with the copy inserted right after the kernel
    inserted: tuple[int, int]  # where the copy is in `source.text` (character offsets)
    kernel: str  # the copy's qualified name, e.g. "optiml_f64::saxpy"
    instantiation: str  # the copy's template arguments, e.g. "<double, 256>", or ""
    buffers: dict[str, str]  # buffer parameter -> its type code in the copy ("f64" if promoted)
    # Scalar parameter -> its type code in the copy. A float scalar is best passed as the original
    # receives it (rounded to float), widened: the copy then computes the same formula.
    scalars: dict[str, str]
    smem_scale: int  # what the launch's dynamic shared memory is multiplied by (2 if promoted)
    static_smem: int | None  # the copy's static shared memory in bytes (None: not compiled)
    notes: list[str] = field(default_factory=list)  # what was promoted

    @cached_property
    def definition(self) -> Kernel:
        """The copy as the source model sees it (what `build_kernel` takes)."""
        return self.source.kernel(self.kernel)


def promote_to_double(
    source: SourceFile, kernel: str, spec: Spec, *, arch: str | None = None, compile: bool = True
) -> Promoted | None:
    """`promote`, or None where the code does not allow it (the reasons are logged)."""
    try:
        return promote(source, kernel, spec, arch=arch, compile=compile)
    except NotPromotable as e:
        logger.info("%s: no double-precision copy of `%s`: %s", source.path, kernel, e)
        return None


def promote(
    source: SourceFile, kernel: str, spec: Spec, *, arch: str | None = None, compile: bool = True
) -> Promoted:
    """The file with `kernel` copied into double precision; `NotPromotable` with the reasons where
    the code does not allow it. With `compile`, the copy is built for `arch` (else the spec's,
    else sm_90) through the build cache, as the runner will build it, which also measures its
    static shared memory."""
    original = source.kernel(kernel)
    promotion = _Promotion(source, original, spec)
    text, inserted = promotion.text()
    promoted = Promoted(
        source=SourceFile(text, source.path),
        inserted=inserted,
        kernel="::".join([*original.name.split("::")[:-1], NAMESPACE, original.short_name]),
        instantiation=promotion.instantiation,
        buffers=_type_codes(spec.buffers),
        scalars=_type_codes(spec.scalars),
        smem_scale=2 if promotion.dynamic_smem else 1,
        static_smem=None,
        notes=promotion.notes(),
    )
    _check_copy(promoted, source, original, promotion.template)
    if not compile:
        _check_smem(promoted, spec, 0)
        return promoted
    static = _compiled_smem(promoted, arch or spec.arch or DEFAULT_ARCH)
    _check_smem(promoted, spec, static)
    notes = [*promoted.notes, f"static shared memory of the copy: {static} bytes"]
    return dataclasses.replace(promoted, static_smem=static, notes=notes)


def _type_codes(args: list[BufferArg] | list[ScalarArg]) -> dict[str, str]:
    """Parameter -> type code in the copy: floating-point codes become f64, the others stay."""
    return {a.name: "f64" if DTYPES[a.dtype].is_float else a.dtype for a in args}


# ---- the file's declarations ------------------------------------------------------------------


@dataclass(frozen=True)
class _Item:
    """A declaration at namespace scope: what the kernel may reach and the copy may hold."""

    node: Node  # as copied: a template_declaration, function_definition, declaration, ...
    # function | type | constant | shared | device_variable | constant_memory | host_variable
    # | host_function | enumerator | macro | kernel
    kind: str
    names: tuple[str, ...]
    namespace: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.names[0]


class _FileIndex:
    """The file's namespace-scope declarations by name, found the way `SourceFile._scan` walks."""

    def __init__(self, source: SourceFile):
        self.source = source
        self.items: list[_Item] = []
        self.namespaces: set[str] = set()
        self.cg_aliases: set[str] = {COOPERATIVE_GROUPS}
        self._scan(source.tree.root_node, ())
        self.by_name: dict[str, list[_Item]] = {}
        for item in self.items:
            for name in item.names:
                self.by_name.setdefault(name, []).append(item)

    def text(self, node: Node) -> str:
        return self.source.node_text(node)

    def _scan(self, node: Node, namespace: tuple[str, ...]) -> None:
        for child in node.named_children:
            t = child.type
            if t == "namespace_definition":
                name = child.child_by_field_name("name")
                inner = namespace
                if name is not None:
                    inner += (self.text(name),)
                    self.namespaces.add(self.text(name))
                if (body := child.child_by_field_name("body")) is not None:
                    self._scan(body, inner)
            elif t == "namespace_alias_definition":
                names = [self.text(c) for c in child.named_children]
                self.namespaces.add(names[0])
                if names[-1].split("::")[-1] == COOPERATIVE_GROUPS:
                    self.cg_aliases.add(names[0])
            elif t == "linkage_specification":
                body = child.child_by_field_name("body")
                if body is not None and body.type == "declaration_list":
                    self._scan(body, namespace)
                elif body is not None:
                    self._declaration(body, body, namespace)
            elif t in ("preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif"):
                self._scan(child, namespace)  # both branches: what the kernel sees is not known
            elif t == "declaration_list":
                self._scan(child, namespace)
            elif t == "template_declaration":
                inner = next(
                    (c for c in child.named_children if c.type != "template_parameter_list"), None
                )
                if inner is not None:
                    self._declaration(child, inner, namespace)
            elif t in ("preproc_def", "preproc_function_def"):
                name = self.text(child.child_by_field_name("name"))
                self.items.append(_Item(child, "macro", (name,), namespace))
            else:
                self._declaration(child, child, namespace)

    def _declaration(self, outer: Node, node: Node, namespace: tuple[str, ...]) -> None:
        def add(kind: str, names: list[str]) -> None:
            self.items.append(_Item(outer, kind, tuple(names), namespace))

        t = node.type
        if t == "function_definition" or (
            t == "declaration" and _function_declarator(node) is not None  # a prototype
        ):
            add(_function_kind(node), [self._fn(node)])
        elif t == "declaration":
            kind = node.child_by_field_name("type")
            if kind is not None and kind.type in _TYPE_SPECIFIERS:
                self._type_specifier(outer, kind, namespace, named_by_typedef=False)
            names = [n for d in node.children_by_field_name("declarator") if (n := _name(self, d))]
            if names:
                add(_variable_kind(node), names)
        elif t in ("type_definition", "alias_declaration"):
            declared = "declarator" if t == "type_definition" else "name"
            add("type", [self.text(d) for d in node.children_by_field_name(declared)])
            kind = node.child_by_field_name("type")
            if kind is not None and kind.type in _TYPE_SPECIFIERS:
                self._type_specifier(outer, kind, namespace, named_by_typedef=True)
        elif t in _TYPE_SPECIFIERS:
            self._type_specifier(outer, node, namespace, named_by_typedef=False)

    def _type_specifier(
        self, outer: Node, spec: Node, namespace: tuple[str, ...], named_by_typedef: bool
    ) -> None:
        """A struct, class, union or enum with a body: its name (unless a typedef gives it) and an
        enum's enumerators, which are names the kernel may use."""
        name = spec.child_by_field_name("name")
        body = spec.child_by_field_name("body")
        if body is None:
            return
        if name is not None and not named_by_typedef:
            self.items.append(_Item(outer, "type", (self.text(name),), namespace))
        if spec.type == "enum_specifier":
            enumerators = [
                self.text(e.child_by_field_name("name"))
                for e in body.named_children
                if e.type == "enumerator"
            ]
            self.items.append(_Item(outer, "enumerator", tuple(enumerators), namespace))

    def _fn(self, node: Node) -> str:
        """A function's unqualified name, as declared."""
        d = _function_declarator(node)
        name = d.child_by_field_name("declarator") if d is not None else None
        while name is not None and name.type == "qualified_identifier":
            name = name.child_by_field_name("name")
        return self.text(name) if name is not None else ""


def _qualifiers(node: Node) -> set[str]:
    """`__global__`, `__device__`, `const`, `extern`, `__shared__`, ... of a declaration."""
    out = {c.type for c in node.children if not c.is_named}
    kinds = ("type_qualifier", "storage_class_specifier")
    return out | {c.text.decode() for c in node.children if c.type in kinds}


def _function_kind(fn: Node) -> str:
    """kernel, function (callable from device code), or host_function (never copied: device code
    cannot call it, whatever name it shares)."""
    q = _qualifiers(fn)
    if "__global__" in q:
        return "kernel"
    return "function" if "__device__" in q or "constexpr" in q else "host_function"


def _variable_kind(decl: Node) -> str:
    q = _qualifiers(decl)
    if "__shared__" in q:
        return "shared"
    if "__constant__" in q:
        return "constant_memory"
    if "__device__" in q or "__managed__" in q:
        return "device_variable"
    if "const" in q or "constexpr" in q:
        return "constant"
    return "host_variable"


def _function_declarator(node: Node) -> Node | None:
    d = node.child_by_field_name("declarator")
    while d is not None and d.type != "function_declarator":
        d = d.child_by_field_name("declarator") if d.type in _DECLARATORS else None
    return d


def _name(index: _FileIndex, declarator: Node | None) -> str | None:
    """The name a declarator declares (through init, pointer, array and reference declarators)."""
    d = declarator
    while d is not None and d.type in _DECLARATORS:
        d = d.child_by_field_name("declarator")
    if d is not None and d.type in ("identifier", "field_identifier"):
        return index.text(d)
    return None


def _through_pointer(declarator: Node | None) -> bool:
    """Whether a declarator declares a pointer or an array."""
    d = declarator
    while d is not None and d.type in _DECLARATORS:
        if d.type in ("pointer_declarator", "array_declarator"):
            return True
        d = d.child_by_field_name("declarator")
    return False


def _code(node: Node) -> Iterator[Node]:
    """Every node under `node` in source order, leaving out what is not code: comments, strings,
    the text of preprocessor lines and the conditions of `#if`s."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if n.type in _NOT_CODE:
            continue
        skip_condition = n.type in ("preproc_if", "preproc_elif")
        children = [
            c
            for i, c in enumerate(n.children)
            if c.type != "preproc_arg"
            and not (skip_condition and n.field_name_for_child(i) == "condition")
        ]
        stack.extend(reversed(children))


def _double_literal(text: str) -> str | None:
    """A float literal's text without its suffix (`1e-5f` -> `1e-5`), None for other numbers."""
    if text[-1:] not in ("f", "F"):
        return None
    body = text[:-1]
    if body[:2].lower() == "0x":
        return body if "p" in body.lower() else None
    return body if any(c in body for c in ".eE") else None


def _promoted_spelling(value: str) -> str:
    """A template argument in double: a floating-point type becomes double, the rest stays."""
    value = value.strip()
    if value in VECTOR_TYPES:
        return VECTOR_TYPES[value]
    dtype = lookup(value)
    return "double" if dtype is not None and dtype.is_float else value


# ---- the promotion ---------------------------------------------------------------------------


@dataclass
class _Scope:
    """What one declaration's code names: what it declares itself (parameters, locals, template
    parameters, a struct's members), which names hold floats, which hold other memory."""

    names: set[str]
    floats: set[str]  # names of a promoted type: scalars, pointers, arrays
    other_memory: set[str]  # pointers and arrays of other types
    templates: set[str]  # a helper's template type parameters (any type, floats included)


class _Promotion:
    """The rewrite of one kernel and the declarations it reaches: what is copied, the edits that
    make each copy compute in double, and the problems that forbid it."""

    def __init__(self, source: SourceFile, kernel: Kernel, spec: Spec):
        self.source = source
        self.kernel = kernel
        self.spec = spec
        self.index = _FileIndex(source)
        self.ast = KernelAST(source, kernel)
        outer = self.ast.outer if self.ast.outer.type == "template_declaration" else self.ast.fn
        namespace = tuple(kernel.name.split("::")[:-1])
        self.kernel_item = _Item(outer, "kernel", (kernel.short_name,), namespace)
        self.template = {name: _promoted_spelling(v) for name, v in spec.template.items()}
        # The kernel's template type parameters instantiated with a floating-point type.
        self.float_templates = {n for n, v in spec.template.items() if v != self.template[n]}
        self.problems: list[str] = []
        self.outside: set[str] = set()  # names from headers, used as they are
        self.counts: dict[str, int] = {}  # what was replaced, how often
        self.renamed: dict[str, str] = {}  # calls and names replaced, for the notes
        self.dynamic_smem = False
        self.uses_double4 = False
        self.reached = self._reach()
        self.promoted_types = self._promoted_type_names()
        self._scopes: dict[int, _Scope] = {}
        self.macros = {
            i: self._macro_value(i.node, i.name) for i in self.reached if i.kind == "macro"
        }
        self._check_device_variables()
        # Problems of a declaration count where it is copied, or is a template (instantiated with
        # doubles from the copy even where its text has no float): a function without floats in
        # its text, left as it is, never sees one.
        self.item_problems: dict[int, list[str]] = {}
        self.edits = {i: self._edits(i) for i in self.reached if i.kind in _COPIED}
        self.changed = self._changed()
        for item in self.edits:
            if (
                item.kind == "kernel"
                or item.node.type == "template_declaration"
                or set(item.names) & self.changed
            ):
                self.problems += self.item_problems[item.node.id]
        if self.problems:
            raise NotPromotable(self.problems)

    # -- what the kernel reaches --

    def _reach(self) -> list[_Item]:
        """The file's declarations that the kernel reaches, directly or through each other, in
        file order, the kernel last; macros are followed through their text, operators through
        the types they take (`a * s` names no `operator*`)."""
        seen: dict[int, _Item] = {}
        used: set[str] = set()
        todo = [self.kernel_item]
        start = self.kernel_item.node.start_byte
        operators = [
            (i, self._uses(i.node)) for i in self.index.items if i.name.startswith("operator")
        ]
        while todo:
            item = todo.pop()
            names = self._macro_words(item) if item.kind == "macro" else self._uses(item.node)
            used |= names
            for name in names:
                for found in self.index.by_name.get(name, []):
                    if found.node.id in seen or found.kind == "kernel":
                        continue
                    if found.kind == "macro" and found.node.start_byte > start:
                        continue  # defined after the kernel: not what the kernel sees
                    seen[found.node.id] = found
                    todo.append(found)
            if not todo:
                todo = [i for i, takes in operators if i.node.id not in seen and takes & used]
                seen.update((i.node.id, i) for i in todo)
        return [*sorted(seen.values(), key=lambda i: i.node.start_byte), self.kernel_item]

    def _uses(self, node: Node) -> set[str]:
        """Names a declaration uses (identifiers, type names, scopes), less its own locals."""
        kinds = ("identifier", "type_identifier", "namespace_identifier")
        used = {self.index.text(n) for n in _code(node) if n.type in kinds}
        return used - self._locals(node)

    def _locals(self, node: Node) -> set[str]:
        """Names a declaration declares inside itself: parameters, locals, template parameters,
        and variables assigned where tree-sitter read a declaration as an expression
        (`cg::thread_block_tile<32> warp = ...` parses as a comparison)."""
        out = set()
        for n in _code(node):
            if n.type in _DECLARING:
                for d in n.children_by_field_name("declarator"):
                    if (name := _name(self.index, d)) is not None:
                        out.add(name)
            elif n.type == "type_parameter_declaration":
                out |= {self.index.text(c) for c in n.named_children if c.type == "type_identifier"}
            elif n.type == "assignment_expression":
                left = n.child_by_field_name("left")
                if left is not None and left.type == "identifier":
                    out.add(self.index.text(left))
        return out

    def _promoted_type_names(self) -> set[str]:
        """Type names that stand for a promoted type in the copy: the kernel's template parameters
        instantiated with one, and the file's types (typedefs, structs) whose text names one."""
        out = set(self.float_templates)
        types = [i for i in self.reached if i.kind == "type"]
        grew = True
        while grew:
            grew = False
            for item in types:
                if not set(item.names) <= out and any(
                    self._promoted_leaf(n, out) for n in _code(item.node)
                ):
                    out |= set(item.names)
                    grew = True
        return out

    def _promoted_leaf(self, n: Node, promoted: set[str]) -> bool:
        """Whether a node is a type name that the copy computes in double."""
        if n.type == "primitive_type":
            return self.index.text(n) == "float"
        if n.type == "type_identifier":
            t = self.index.text(n)
            return t in HALF_TYPES or t in VECTOR_TYPES or t in promoted
        return False

    def _holds_floats(self, node: Node, promoted: set[str]) -> bool:
        return any(self._promoted_leaf(n, promoted) for n in _code(node))

    # -- names by declaration --

    def scope(self, item: _Item) -> _Scope:
        """What `item`'s code names, and what its names hold (computed once per declaration)."""
        if item.node.id in self._scopes:
            return self._scopes[item.node.id]
        templates = set()
        if item.kind != "kernel":
            templates = {
                self.index.text(c)
                for n in _code(item.node)
                if n.type == "type_parameter_declaration"
                for c in n.named_children
                if c.type == "type_identifier"
            }
        scope = _Scope(self._locals(item.node) | templates, set(), set(), templates)
        variables = [i.node for i in self.reached if i.kind in _VARIABLES]
        for node in [*variables, item.node]:
            self._declared(node, scope)
        self._scopes[item.node.id] = scope
        return scope

    def _declared(self, node: Node, scope: _Scope) -> None:
        """Sort the names declared under `node` into floats and other memory; a struct's fields
        become names its methods may use."""
        promoted = self.promoted_types | scope.templates
        for n in _code(node):
            if n.type not in _DECLARING:
                continue
            kind = n.child_by_field_name("type")
            auto = kind is not None and kind.type == "placeholder_type_specifier"
            is_float = auto or (kind is not None and self._holds_floats(kind, promoted))
            for d in n.children_by_field_name("declarator"):
                name = _name(self.index, d)
                if name is None:
                    continue
                if is_float:
                    scope.floats.add(name)
                elif _through_pointer(d):
                    scope.other_memory.add(name)
                if n.type == "field_declaration":
                    scope.names.add(name)

    @cached_property
    def methods(self) -> set[str]:
        """Member functions of the file's types that the kernel reaches."""
        return {
            self.index._fn(n)
            for item in self.reached
            if item.kind == "type"
            for n in _code(item.node)
            if n.type in ("function_definition", "field_declaration", "declaration")
            and _function_declarator(n) is not None
        }

    # -- the edits of one declaration --

    def _edits(self, item: _Item) -> _Edits:
        """The replacements that make one declaration compute in double; its problems are kept
        apart (`item_problems`)."""
        edits = _Edits(self.source)
        scope = self.scope(item)
        mark = len(self.problems)
        for n in _code(item.node):
            t = n.type
            if t == "ERROR":
                self.problems.append(f"line {n.start_point[0] + 1} of `{item.name}` does not parse")
            elif t == "primitive_type" and self.index.text(n) == "float":
                edits.replace(n, "double")
                self._count("float -> double")
            elif t == "type_identifier":
                self._type_name(n, item, scope, edits)
            elif t == "number_literal" and (literal := _double_literal(self.index.text(n))):
                edits.replace(n, literal)
                self._count("float literals as double")
            elif t == "identifier":
                self._identifier(n, item, scope, edits)
            elif t == "qualified_identifier":
                self._qualified(n, edits)
            elif t == "call_expression":
                self._call(n, item, scope, edits)
            elif t == "cast_expression":
                self._cast(n, n.child_by_field_name("type"), n.child_by_field_name("value"), scope)
            elif t == "gnu_asm_expression":
                self._asm(n, item, scope)
            elif t == "union_specifier" and self._holds_floats(n, self.promoted_types):
                self.problems.append(f"a union in `{item.name}` overlays float with other types")
            elif t == "declaration":
                self._dynamic_shared(n, item, scope)
            elif t in ("preproc_def", "preproc_function_def"):
                name = self.index.text(n.child_by_field_name("name"))
                if self._macro_value(n, name) is not None:
                    self.problems.append(f"`{item.name}` defines `{name}`, a macro with floats")
        self.item_problems[item.node.id] = self.problems[mark:]
        del self.problems[mark:]
        return edits

    def _type_name(self, n: Node, item: _Item, scope: _Scope, edits: _Edits) -> None:
        t = self.index.text(n)
        if t in HALF_TYPES:
            edits.replace(n, "double")
            self._count(f"{t} -> double")
        elif t in VECTOR_TYPES:
            edits.replace(n, VECTOR_TYPES[t])
            self._count(f"{t} -> {VECTOR_TYPES[t]}")
            self.uses_double4 |= t == "float4"
        elif t in PACKED_TYPES:
            self.problems.append(
                f"`{item.name}` uses `{t}`: two packed 16-bit values have no double form"
            )
        elif not (t in scope.names or t in KNOWN_TYPES or t in self.index.by_name or _scoped(n)):
            self.problems.append(f"the type `{t}` is declared outside this file")

    def _identifier(self, n: Node, item: _Item, scope: _Scope, edits: _Edits) -> None:
        t = self.index.text(n)
        if _scoped(n) or t in scope.names or t in self.index.by_name:
            return  # a qualified name is checked as a whole
        if t in RENAMES:
            edits.replace(n, RENAMES[t])
            self.renamed[t] = RENAMES[t]
        elif t in CALL_FORMS:
            if not _is_callee(n):
                self.problems.append(f"`{item.name}` uses `{t}` other than calling it")
        elif t in BIT_CASTS:
            self.problems.append(
                f"`{t}` in `{item.name}` reinterprets a float's bits (bit tricks, or an integer "
                "atomic on float memory): a double has other bits"
            )
        elif t in KNOWN_CALLS or t in KNOWN_NAMES or t in CASTS or t.startswith("CUDART_"):
            return
        elif _is_callee(n):
            self.problems.append(
                f"`{item.name}` calls `{t}`, which is declared outside this file: its float "
                "arguments cannot be promoted"
            )
        else:
            self.outside.add(t)  # a constant or variable of a header: used as it is

    def _qualified(self, n: Node, edits: _Edits) -> None:
        """`std::max`, `cg::tiled_partition<32>`, `detail::helper`: the root scope says which
        names may follow; a reference into the file's namespaces goes to the copy, if copied."""
        if n.parent is not None and n.parent.type == "qualified_identifier":
            return  # the outermost qualified name is checked
        parts = _qualified_parts(self.index, n)
        root, last = parts[0], parts[-1]
        if root in ("std", "cuda"):
            ok = parts[1] in STD_NAMES
        elif root in self.index.cg_aliases:
            ok = parts[1] in CG_NAMES
        elif root == "" or root in self.index.namespaces:
            ok = last in self.index.by_name
            edits.qualified.append((n, last))
        else:
            ok = root in self.index.by_name  # a type's member: `Mode::A`, `Vec::zero()`
        if not ok:
            self.problems.append(
                f"`{self.index.text(n)}` is declared outside this file, or has no double form"
            )

    def _call(self, n: Node, item: _Item, scope: _Scope, edits: _Edits) -> None:
        fn = n.child_by_field_name("function")
        args = n.child_by_field_name("arguments")
        if any(c.type == "kernel_call_syntax" for c in n.named_children):
            self.problems.append(f"`{item.name}` launches a kernel")
        if fn is None or args is None:
            return
        name = self.index.text(fn)
        values = [a for a in args.named_children if a.type != "comment"]
        if fn.type == "identifier" and name in CALL_FORMS and name not in scope.names:
            arity, form = CALL_FORMS[name]
            if len(values) != arity:
                self.problems.append(f"`{name}` with {len(values)} arguments in `{item.name}`")
                return
            edits.rebuild(n, form, values)
            self.renamed[f"{name}({', '.join('xyz'[:arity])})"] = form.format(*"xyz")
        elif fn.type == "identifier" and name in OTHER_ATOMICS and values:
            if self._names(values[0]) & scope.floats:
                self.problems.append(
                    f"`{name}` on float memory in `{item.name}` has no double form (of the "
                    "atomics only atomicAdd has)"
                )
        elif fn.type == "template_function":
            cast = fn.child_by_field_name("name")
            targs = fn.child_by_field_name("arguments")
            if cast is not None and self.index.text(cast) in CASTS and targs is not None:
                target = next(iter(targs.named_children), None)
                self._cast(n, target, values[0] if values else None, scope)
        elif fn.type == "field_expression":
            method = self.index.text(fn.child_by_field_name("field"))
            if method not in CG_METHODS and method not in self.methods:
                self.problems.append(
                    f"`{item.name}` calls the method `{method}`, declared outside this file"
                )

    def _cast(self, n: Node, target: Node | None, value: Node | None, scope: _Scope) -> None:
        """A pointer or reference cast sees memory as another type: from float memory to another
        type it reads a float's bytes; to a float type from other memory the element sizes would
        disagree."""
        if target is None or value is None or target.type != "type_descriptor":
            return
        declarator = target.child_by_field_name("declarator")
        if declarator is None or not (
            "pointer" in declarator.type or "reference" in declarator.type
        ):
            return
        kind = target.child_by_field_name("type")
        to_float = kind is not None and self._holds_floats(
            kind, self.promoted_types | scope.templates
        )
        names = self._names(value)
        from_float, from_other = bool(names & scope.floats), bool(names & scope.other_memory)
        cast = self.index.text(target)
        if to_float and (from_other or not from_float):
            self.problems.append(
                f"`{self.index.text(n)}` casts memory that is not float to `{cast}`: its layout "
                "would change with the element size"
            )
        elif not to_float and from_float:
            self.problems.append(
                f"`{self.index.text(n)}` reinterprets float memory as `{cast}`: a double has "
                "other bytes"
            )

    def _asm(self, n: Node, item: _Item, scope: _Scope) -> None:
        """Inline PTX is written for its operands' register widths: where one is a float (a
        16- or 32-bit float register, or a float of the code) the copy cannot keep it."""
        for operand in _code(n):
            if operand.type not in ("gnu_asm_input_operand", "gnu_asm_output_operand"):
                continue
            constraint = operand.child_by_field_name("constraint")
            value = operand.child_by_field_name("value")
            letters = self.index.text(constraint).strip('"=+&') if constraint is not None else ""
            if set(letters) & {"f", "h"} or (
                value is not None and self._names(value) & scope.floats
            ):
                self.problems.append(
                    f"`{item.name}` has inline PTX (`asm`) on a float operand: "
                    f"`{self.index.text(operand)}`"
                )
                return

    def _dynamic_shared(self, decl: Node, item: _Item, scope: _Scope) -> None:
        """`extern __shared__` of a promoted type: the launch's dynamic shared memory doubles."""
        q = _qualifiers(decl)
        kind = decl.child_by_field_name("type")
        if "__shared__" not in q or "extern" not in q or kind is None:
            return
        if self._holds_floats(kind, self.promoted_types):
            self.dynamic_smem = True
        elif self._holds_floats(kind, scope.templates):
            self.problems.append(f"`{item.name}` declares dynamic shared memory of a template type")

    def _check_device_variables(self) -> None:
        """A `__device__` float the kernel reaches lives outside its buffers: the copy would share
        it with the original at float precision."""
        for item in self.reached:
            if item.kind == "device_variable" and self._holds_floats(
                item.node, self.promoted_types
            ):
                self.problems.append(
                    f"the kernel uses the float `__device__` variable `{item.name}`, which lives "
                    "outside its buffers"
                )

    def _names(self, node: Node) -> set[str]:
        return {self.index.text(n) for n in _code(node) if n.type == "identifier"}

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # -- macros --

    def _macro_words(self, item: _Item) -> set[str]:
        value = item.node.child_by_field_name("value")
        if value is None:
            return set()
        words = {m[0] for m in _TOKEN.finditer(self.index.text(value)) if m.lastgroup == "name"}
        return words - set(_macro_params(self.index, item.node))

    def _macro_value(self, macro: Node, name: str) -> str | None:
        """A macro's value in double, token by token, or None where it does not change."""
        value = macro.child_by_field_name("value")
        if value is None:
            return None
        params = set(_macro_params(self.index, macro))
        out = []
        for m in _TOKEN.finditer(self.index.text(value)):
            token = new = m[0]
            if m.lastgroup == "number":
                new = _double_literal(token) or token
            elif m.lastgroup == "name" and token not in params:
                if token == "float" or token in HALF_TYPES:
                    new = "double"
                new = VECTOR_TYPES.get(token, RENAMES.get(new, new))
                if token in BIT_CASTS or token in CALL_FORMS or token in PACKED_TYPES:
                    self.problems.append(f"the macro `{name}` uses `{token}`")
            out.append(new)
        text = "".join(out)
        return text if text != self.index.text(value) else None

    # -- what is copied --

    def _changed(self) -> set[str]:
        """Names whose declarations are copied: those with edits, and those that use them (a type
        holding a promoted type, a function calling a promoted function), as whole overload
        sets; and macros whose value changes."""
        changed = {i.name for i, e in self.edits.items() if e}
        changed |= {i.name for i, value in self.macros.items() if value is not None}
        uses = {i: self._uses(i.node) for i in self.edits}
        grew = True
        while grew:
            grew = False
            for item in self.edits:
                if item.name not in changed and uses[item] & changed:
                    changed.add(item.name)
                    grew = True
                elif item.name in changed and item.namespace != self.kernel_item.namespace:
                    hidden = self._hidden_from_copy(item, uses[item]) - changed
                    changed |= hidden
                    grew |= bool(hidden)
        return changed

    def _hidden_from_copy(self, item: _Item, uses: set[str]) -> set[str]:
        """What a declaration copied from another namespace uses by its plain name from its own
        namespace: not visible from the copy's namespace, so copied too."""
        visible = {
            self.kernel_item.namespace[:n] for n in range(len(self.kernel_item.namespace) + 1)
        }
        return {
            name
            for name in uses
            for j in self.index.by_name.get(name, [])
            if j.kind in _COPIED and j.namespace not in visible and j in self.edits
        }

    @cached_property
    def copies(self) -> list[_Item]:
        """The declarations the copy holds, in file order, the kernel last."""
        copied = [i for i in self.edits if i.kind == "kernel" or set(i.names) & self.changed]
        for item in copied[:-1]:
            homes = {
                j.namespace for j in self.index.by_name[item.name] if j.kind in _COPIED - {"kernel"}
            }
            if len(homes) > 1:
                raise NotPromotable(f"`{item.name}` is declared in several namespaces")
        return copied

    @property
    def instantiation(self) -> str:
        return f"<{', '.join(self.template.values())}>" if self.template else ""

    # -- the text --

    def text(self) -> tuple[str, tuple[int, int]]:
        """The file with the copy inserted right after the kernel's definition, and where the
        inserted text is (character offsets)."""
        macros = [(i, value) for i, value in self.macros.items() if value is not None]
        lines = [
            "",
            "",
            f"// `{self.kernel.name}` computed in double precision, to check its rewrites against "
            "(inserted by OptiML)",
        ]
        for item, value in macros:
            params = item.node.child_by_field_name("parameters")
            signature = item.name + (self.index.text(params) if params is not None else "")
            lines += [f'#pragma push_macro("{item.name}")', f"#undef {item.name}"]
            lines.append(f"#define {signature} {value}")
        c_linkage = _inside_c_linkage(self.ast.outer)
        if c_linkage:
            lines.append('extern "C++" {')
        lines.append(f"namespace {NAMESPACE} {{")
        if self.uses_double4:
            lines.append("#pragma nv_diag_suppress 1444  // double4: deprecated in CUDA 13")
        lines += [self._copy(item) + "\n" for item in self.copies]
        if self.uses_double4:
            lines.append("#pragma nv_diag_default 1444")
        lines.append(f"}}  // namespace {NAMESPACE}")
        if c_linkage:
            lines.append('}  // extern "C++"')
        lines += [f'#pragma pop_macro("{item.name}")' for item, _ in reversed(macros)]
        raw, at, block = self.source._bytes, self.ast.outer.end_byte, "\n".join(lines)
        before = raw[:at].decode("utf-8", errors="replace")
        after = raw[at:].decode("utf-8", errors="replace")
        return before + block + after, (len(before), len(before) + len(block))

    def _copy(self, item: _Item) -> str:
        """One declaration in double: its edits, and references into the file's namespaces to
        the declarations that are copied too (`detail::helper` -> `helper`)."""
        edits = self.edits[item]
        for node, name in edits.qualified:
            if name in self.changed:
                edits.unqualify(node)
        text = edits.render(item.node)
        return text + ";" if item.node.type in _TYPE_SPECIFIERS else text

    def notes(self) -> list[str]:
        kinds: dict[str, list[str]] = {}
        for item in self.copies[:-1]:
            kinds.setdefault(_KIND_NAMES[item.kind], []).append(f"`{item.name}`")
        listed = "".join(f", {k} {', '.join(dict.fromkeys(n))}" for k, n in kinds.items())
        out = [f"copied into `{NAMESPACE}`: the kernel{listed}"]
        out += [f"{what}: {n}" for what, n in self.counts.items()]
        if self.renamed:
            out.append("replaced: " + ", ".join(f"{a} -> {b}" for a, b in self.renamed.items()))
        if macros := [i.name for i, value in self.macros.items() if value is not None]:
            out.append(f"macros redefined in double around the copy: {', '.join(macros)}")
        if self.outside:
            out.append(
                f"names from outside this file, as they are: {', '.join(sorted(self.outside))}"
            )
        if self.template != self.spec.template:
            out.append(f"instantiation {self.spec.instantiation} -> {self.instantiation}")
        if self.dynamic_smem:
            out.append("dynamic shared memory holds doubles: launch with twice the spec's smem")
        if not (self.counts or self.renamed or self.float_templates):
            out.append("nothing to promote: the kernel computes no floating-point values")
        return out


class _Edits:
    """Replacements within one declaration: node -> text, and nodes rebuilt from their rewritten
    parts (a call from its arguments). `render` writes a node back with them applied."""

    def __init__(self, source: SourceFile):
        self.source = source
        self.texts: dict[int, str] = {}
        self.forms: dict[int, tuple[str, list[Node]]] = {}
        self.starts: list[int] = []
        # Qualified names into the file's namespaces: (node, last name), unqualified if copied.
        self.qualified: list[tuple[Node, str]] = []

    def __bool__(self) -> bool:
        return bool(self.texts or self.forms)

    def replace(self, node: Node, text: str) -> None:
        self.texts[node.id] = text
        bisect.insort(self.starts, node.start_byte)

    def rebuild(self, node: Node, form: str, parts: list[Node]) -> None:
        self.forms[node.id] = (form, parts)
        bisect.insort(self.starts, node.start_byte)

    def unqualify(self, node: Node) -> None:
        """`detail::helper` -> `helper`: the declaration's copy in the promoted namespace."""
        name = node.child_by_field_name("name")
        while name is not None and name.type == "qualified_identifier":
            name = name.child_by_field_name("name")
        if name is not None:
            self.rebuild(node, "{0}", [name])

    def render(self, node: Node) -> str:
        if node.id in self.texts:
            return self.texts[node.id]
        if node.id in self.forms:
            form, parts = self.forms[node.id]
            return form.format(*(self.render(p) for p in parts))
        raw = self.source._bytes
        i = bisect.bisect_left(self.starts, node.start_byte)
        if i == len(self.starts) or self.starts[i] >= node.end_byte:
            return raw[node.start_byte : node.end_byte].decode("utf-8", errors="replace")
        out, pos = [], node.start_byte
        for child in node.children:
            out.append(raw[pos : child.start_byte].decode("utf-8", errors="replace"))
            out.append(self.render(child))
            pos = child.end_byte
        out.append(raw[pos : node.end_byte].decode("utf-8", errors="replace"))
        return "".join(out)


# ---- small helpers ------------------------------------------------------------------------------

# A macro's value as preprocessing tokens: numbers, names, strings, anything else one by one.
_TOKEN = re.compile(
    r"(?P<number>\.?\d(?:[eEpP][+-]|[\w.'])*)|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<string>\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*')|(?P<other>.)",
    re.S,
)


def _macro_params(index: _FileIndex, macro: Node) -> list[str]:
    params = macro.child_by_field_name("parameters")
    return [index.text(p) for p in params.named_children] if params is not None else []


def _is_callee(n: Node) -> bool:
    """Whether a name is what a call calls (`f(x)`, `f<float>(x)`)."""
    parent = n.parent
    while parent is not None and parent.type == "template_function":
        n, parent = parent, parent.parent
    return (
        parent is not None
        and parent.type == "call_expression"
        and parent.child_by_field_name("function") == n
    )


def _scoped(n: Node) -> bool:
    """A name qualified by a scope (`cg::thread_block`, `cg::tiled_partition<32>`): checked with
    the qualified name."""
    parent = n.parent
    while parent is not None and parent.type in ("template_type", "template_function"):
        parent = parent.parent
    return parent is not None and parent.type == "qualified_identifier"


def _qualified_parts(index: _FileIndex, n: Node) -> list[str]:
    """`std::numeric_limits<float>::max` -> ["std", "numeric_limits", "max"]; `::f` -> ["", "f"]."""
    parts = [] if n.child_by_field_name("scope") is not None else [""]
    node: Node | None = n
    while node is not None:
        scope = node.child_by_field_name("scope")
        if scope is not None:
            parts.append(_plain_name(index, scope))
        name = node.child_by_field_name("name")
        if name is not None and name.type == "qualified_identifier":
            node = name
            continue
        if name is not None:
            parts.append(_plain_name(index, name))
        break
    return parts


def _plain_name(index: _FileIndex, node: Node) -> str:
    if node.type in ("template_type", "template_function"):
        node = node.child_by_field_name("name")
    return index.text(node)


def _inside_c_linkage(node: Node) -> bool:
    """Whether a definition stands inside an `extern "C" { ... }` block."""
    parent = node.parent
    while parent is not None:
        if parent.type == "linkage_specification":
            return True
        parent = parent.parent
    return False


# ---- checks on the result ---------------------------------------------------------------------


def copy_namespaces(promoted: Promoted) -> list[Node]:
    """The `optiml_f64` namespace definitions holding the copy, in the promoted file's tree."""
    stack, out = [promoted.source.tree.root_node], []
    while stack:
        n = stack.pop()
        name = n.child_by_field_name("name") if n.type == "namespace_definition" else None
        if name is not None and promoted.source.node_text(name) == NAMESPACE:
            out.append(n)
        stack.extend(n.named_children)
    return out


def float_types_left(promoted: Promoted) -> list[str]:
    """Single- and half-precision type names still in the copy, with their lines (none, after a
    promotion)."""
    left = []
    for ns in copy_namespaces(promoted):
        for n in _code(ns):
            t = promoted.source.node_text(n)
            if (n.type == "primitive_type" and t == "float") or (
                n.type == "type_identifier" and (t in HALF_TYPES or t in VECTOR_TYPES)
            ):
                left.append(f"`{t}` at line {n.start_point[0] + 1}")
    return left


def _check_copy(
    promoted: Promoted, source: SourceFile, original: Kernel, template: dict[str, str]
) -> None:
    """The copy holds no float type and is found by its name, its buffers have the types the
    promotion says, and the original kernel is as written."""
    if not copy_namespaces(promoted):
        raise NotPromotable("the copy's namespace does not parse")
    if left := float_types_left(promoted):
        raise NotPromotable(f"float types left in the copy: {', '.join(left)}")
    start, end = promoted.inserted
    if promoted.source.text[:start] + promoted.source.text[end:] != source.text:
        raise NotPromotable("the promoted file is not the original with the copy inserted")
    for p in promoted.definition.params:
        dtype = lookup(template.get(p.type_text, p.type_text))
        want = promoted.buffers.get(p.name) or promoted.scalars.get(p.name)
        if dtype is not None and want is not None and dtype.code != want:
            raise NotPromotable(f"`{p.name}` is `{p.declared}` in the copy, not {want}")


def _compiled_smem(promoted: Promoted, arch: str) -> int:
    """Build the copy's device code (the launcher's kernel at its instantiation, no host compile
    or link: a third of the runner's build, which the runner makes when it runs the copy); its
    static shared memory."""
    from optiml.harness.build import build_kernel, kernel_resources
    from optiml.harness.nvcc import parse_resources

    build = build_kernel(
        promoted.source,
        promoted.definition,
        instantiation=promoted.instantiation,
        arch=arch,
        mode="cubin",
    )
    # ptxas reports the resources of a kernel whose static shared memory is too large, and fails.
    found = build.resources or kernel_resources(parse_resources(build.log), promoted.definition)
    static = found.static_smem_bytes if found is not None else 0
    if static > STATIC_SMEM_LIMIT:
        raise NotPromotable(
            f"the copy needs {static} bytes of static shared memory (a block may declare "
            f"{STATIC_SMEM_LIMIT})"
        )
    if not build.ok:
        errors = [m for m in build.messages if m.severity == "error"] or build.messages
        raise NotPromotable(
            f"the copy does not compile: {errors[0] if errors else build.log[-300:]}"
        )
    return static


def _check_smem(promoted: Promoted, spec: Spec, static: int) -> None:
    """The launch's shared memory, the dynamic part doubled where it holds doubles, must fit."""
    if promoted.smem_scale == 1:
        return
    for case in spec.cases():
        dynamic = case.smem * promoted.smem_scale
        if static + dynamic > SMEM_LIMIT:
            raise NotPromotable(
                f"at {case.label} the copy needs {dynamic} bytes of dynamic shared memory "
                f"({case.smem} × {promoted.smem_scale}) beside {static} static: a block has "
                f"{SMEM_LIMIT}"
            )
