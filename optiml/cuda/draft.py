"""Drafting a spec for a kernel that has none.

Roles come from the lifted model where the kernel lifts (which buffers it loads, stores, updates
atomically), else from the body's reads and writes. Lengths come from the host's allocation of the
buffer passed at the kernel's launch (`optiml.cuda.host`), else from the largest element the
model's accesses reach (`optiml.cuda.extent`). The launch comes from the host's `<<<...>>>`, else
from the thread indices the guards bound. Sizes are the kernel's integer parameters and the host's
variables the lengths and the launch use, with the host's values where they are constant. What
was guessed is said in `# guessed:` lines of the draft (and as warnings); `validate` parses the
draft and checks it.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

from tree_sitter import Node

from optiml.cuda.extent import Poly, extents, poly_add, poly_text
from optiml.cuda.host import HostReader
from optiml.cuda.source import Kernel, SourceFile
from optiml.cuda.types import lookup
from optiml.cuda.unknowns import Resolved, resolve, substitute, unknowns_in
from optiml.errors import SourceWarning
from optiml.expr import Expr, ExprError

_ATOMICS = re.compile(r"^atomic\w+$")
DEFAULT_SIZE = "1 << 24"
DEFAULT_BLOCK = 256


def pointer_roles(source: SourceFile, kernel: Kernel) -> dict[str, str]:
    """in / out / inout for each pointer parameter, from reads and writes in the body."""
    params = {p.name for p in kernel.params if p.is_pointer}
    reads: set[str] = set()
    writes: set[str] = set()
    root = source.tree.root_node.descendant_for_byte_range(*_byte_range(source, kernel.body_span))
    # `float* row = out + r * cols;` makes `row` an alias of `out`: its writes are `out`'s.
    alias = {p: p for p in params}
    for decl in _descendants(root, "init_declarator"):
        d, value = decl.child_by_field_name("declarator"), decl.child_by_field_name("value")
        if d is not None and d.type == "pointer_declarator" and value is not None:
            base = _base_identifier(source, value)
            target = _base_identifier(source, d.child_by_field_name("declarator"))
            if base in alias and target:
                alias[target] = alias[base]
    names = set(alias)
    stack: list[Node] = [root] if root is not None else []
    while stack:
        n = stack.pop()
        if n.type in ("assignment_expression", "update_expression"):
            target = n.child_by_field_name("left") or n.child_by_field_name("argument")
            base = _base_identifier(source, target)
            if base in names:
                writes.add(base)
                op = n.child_by_field_name("operator")
                if n.type == "update_expression" or (
                    op is not None and source.node_text(op) != "="
                ):
                    reads.add(base)
            right = n.child_by_field_name("right")
            if right is not None:
                stack.append(right)
            if target is not None and target.type == "subscript_expression":
                stack.extend(
                    target.child_by_field_name("indices").named_children
                    if target.child_by_field_name("indices")
                    else []
                )
            continue
        if n.type == "init_declarator":
            # the declared name is not a read of anything; its initializer may be
            value = n.child_by_field_name("value")
            declarator = n.child_by_field_name("declarator")
            is_alias = declarator is not None and declarator.type == "pointer_declarator"
            if value is not None and not (is_alias and _base_identifier(source, value) in names):
                stack.append(value)  # `float* row = out + k` takes an address: no read of `out`
            continue
        if n.type == "call_expression":
            fn = n.child_by_field_name("function")
            args = n.child_by_field_name("arguments")
            if (
                fn is not None
                and _ATOMICS.match(source.node_text(fn))
                and args is not None
                and args.named_children
            ):
                base = _base_identifier(source, args.named_children[0])
                if base in names:
                    reads.add(base)
                    writes.add(base)
                stack.extend(args.named_children[1:])
                continue
        if n.type == "identifier" and source.node_text(n) in names:
            reads.add(source.node_text(n))
        stack.extend(n.named_children)
    reads = {alias[n] for n in reads}
    writes = {alias[n] for n in writes}
    roles = {}
    for p in kernel.params:
        if not p.is_pointer:
            continue
        w, r = p.name in writes, p.name in reads
        roles[p.name] = "inout" if (w and r) else "out" if w else "in"
    return roles


def _descendants(node: Node | None, type_name: str) -> list[Node]:
    out, stack = [], [node] if node is not None else []
    while stack:
        n = stack.pop()
        if n.type == type_name:
            out.append(n)
        stack.extend(n.named_children)
    return out


def _byte_range(source: SourceFile, span) -> tuple[int, int]:
    return len(source.text[: span.start].encode()), len(source.text[: span.end].encode())


def _base_identifier(source: SourceFile, node: Node | None) -> str | None:
    """`y` for `y[i]`, `*(y + i)`, `&y[i]`, `y + i`, `(y)`."""
    while node is not None:
        if node.type == "identifier":
            return source.node_text(node)
        if node.type in ("subscript_expression", "field_expression"):
            node = node.child_by_field_name("argument")
        elif node.type in ("pointer_expression", "parenthesized_expression", "cast_expression"):
            node = (
                node.child_by_field_name("argument")
                or node.child_by_field_name("value")
                or (node.named_children[-1] if node.named_children else None)
            )
        elif node.type == "binary_expression":
            node = node.child_by_field_name("left")
        else:
            return None
    return None


@dataclass
class Draft:
    """A drafted spec: its text (with a `# guessed:` line for each guess) and the guesses, each
    `file:line: what was guessed`."""

    text: str
    guesses: list[str] = field(default_factory=list)
    launch_line: int | None = None  # the host launch it was read from


def draft_spec(source: SourceFile, kernel: Kernel) -> str:
    """The text of an `@optiml` comment for `kernel`, to be placed right above it; each guess is
    also a `SourceWarning`."""
    d = draft(source, kernel)
    for g in d.guesses:
        warnings.warn(f"guessed: {g}", SourceWarning, stacklevel=2)
    return d.text


def draft(source: SourceFile, kernel: Kernel, check: bool = True, compile: bool = True) -> Draft:
    """The drafted spec of `kernel`, checked (`optiml.cuda.validate`) unless `check` is off:
    what fails is said in a guess line; `compile`: the check's nvcc run (cached by content)."""
    kline = kernel.span.start_point[0] + 1
    noted: list[tuple[int, str]] = []

    def guess(line: int, what: str) -> None:
        if (line, what) not in noted:
            noted.append((line, what))

    reader = HostReader(source, kernel)
    launch = reader.launch()
    if launch is not None:
        for g in launch.guessed:
            guess(launch.line, g)
        if launch.sites > 1:
            guess(
                launch.line,
                f"the kernel is launched {launch.sites} times; the first launch is read",
            )
    sites = source.launch_sites(kernel.name)
    template = _template(
        source, kernel, sites[0].template_args if sites else _instantiated(source, kernel)
    )
    template_ints = {k for k, v in template.items() if re.fullmatch(r"\d+", v)}
    int_params = [
        p.name
        for p in kernel.params
        if not p.is_pointer
        and (d := lookup(source.resolve_type(template.get(p.type_text, p.type_text)))) is not None
        and not d.is_float
    ]
    file_names = set(source.macros) | set(source.constants) | template_ints
    host_args = launch.args if launch else {}
    free = {
        n
        for n in (launch.free if launch else {})
        if n not in host_args.values() and n not in template
    }
    allowed = set(int_params) | free | file_names

    lifted = _lift(source, kernel, template)
    sample = _sample_env(source, int_params, free)
    ext = extents(lifted, sample) if lifted is not None else None

    # roles
    if ext is not None:
        roles = {}
        for p in kernel.params:
            if p.is_pointer:
                w, r = p.name in ext.writes, p.name in ext.reads | ext.rmw
                roles[p.name] = "inout" if (w and r) else "out" if w else "in"
    else:
        roles = pointer_roles(source, kernel)

    # lengths
    resolved = (
        resolve(
            ext,
            lifted,
            int_params,
            launch.grid if launch else None,
            launch.block if launch else None,
            _dtype_codes(source, kernel, template),
        )
        if ext is not None
        else Resolved()
    )
    for atom, top in resolved.tops.items():  # a block index paired with a parameter: its count
        if atom.startswith(("?blockIdx.", "?g.")) and ext is not None:
            ext.domain.setdefault(atom[1:], poly_add(top, {(): 1}))

    def buffer_lengths() -> tuple[dict[str, str], list[tuple[int, str]]]:
        lengths: dict[str, str] = {}
        said: list[tuple[int, str]] = []
        for p in kernel.params:
            if not p.is_pointer:
                continue
            host = launch.lengths.get(p.name) if launch else None
            if host is not None and _valid(host, allowed):
                lengths[p.name] = _tidy(host)
                continue
            texts = [substitute(q, resolved) for q in (ext.lengths.get(p.name, []) if ext else [])]
            texts = [t for t in texts if t is not None and _valid(t, allowed)]
            if texts:
                lengths[p.name] = max(texts, key=lambda t: _value(t, sample))
                if ext.unbounded.get(p.name):
                    said.append(
                        (
                            kline,
                            f"`{p.name}`'s length from its bounded accesses only"
                            " (an index is indirect or unbounded)",
                        )
                    )
                continue
            lengths[p.name] = _fallback_length(source, kernel, int_params)
            said.append(
                (
                    kline,
                    f"`{p.name}`'s length ({lengths[p.name]}): no allocation and no bounded access",
                )
            )
        return lengths, said

    lengths, said = buffer_lengths()

    # launch: a host constant only the launch uses (`threadsPerBlock = 256`) is its value there
    length_names = set().union(*(Expr.parse(t).names() for t in lengths.values()))
    length_names |= set().union(*(_names(v) for v in host_args.values()))
    inline = {
        n: v
        for n, v in (launch.free.items() if launch else [])
        if v is not None and n not in length_names and n not in int_params
    }
    grid = block = smem = None
    if launch is not None and launch.grid and launch.block:
        g = [_tidy(_substitute(x, inline)) for x in launch.grid]
        b = [_tidy(_substitute(x, inline)) for x in launch.block]
        launch_names = allowed | {"sm_count", "max_threads_per_sm"}
        if all(_valid(x, launch_names) for x in g + b):
            grid, block = g, b
            sm = _tidy(_substitute(launch.smem, inline)) if launch.smem is not None else None
            if sm is not None and sm != "0":
                if _valid(sm, allowed):
                    smem = sm
                else:
                    guess(launch.line, "dynamic shared memory not read: left out")
        else:
            guess(
                launch.line, "the launch's configuration not read: drafted from the kernel's guards"
            )
    if launch is not None and not (launch.grid and launch.block):
        guess(launch.line, "the launch's configuration not read: drafted from the kernel's guards")
    if grid is None:
        grid, block = _model_launch(source, kernel, ext, lengths, lifted, allowed)
        if launch is None:
            guess(kline, "no launch of the kernel in the file: the launch drafted from its guards")

    # a block index no guard bounds and nothing else resolves: the drafted grid's
    late = {
        a: grid["xyz".index(a[-1])]
        for a, _ in (unknowns_in(ext) if ext is not None else [])
        if a.startswith("?blockIdx.") and a not in resolved.tops and a not in resolved.texts
        if "xyz".index(a[-1]) < len(grid)
    }
    if late:
        resolved.texts.update(late)
        for a in late:
            resolved.how[a] = "the drafted grid"
        lengths, said = buffer_lengths()
    for line, what in said:
        guess(line, what)
    for atom, how in resolved.how.items():
        what = (
            f"`{atom[1:]}` has no guard: its count from {how}"
            if atom.startswith(("?blockIdx.", "?g."))
            else f"the values of `{atom[1:]}` index other buffers: their range from {how}"
        )
        guess(kline, what)

    # sizes and scalars
    used: set[str] = set()
    for text in [*lengths.values(), *grid, *block, smem or "0"]:
        used |= Expr.parse(text).names()
    scalar_values: dict[str, str] = {}
    structs: list[str] = []
    for p in kernel.params:
        if p.is_pointer or (p.name in int_params and p.name in used):
            continue
        fields = source.structs.get(source.resolve_type(template.get(p.type_text, p.type_text)))
        if fields is not None:
            values = ", ".join(
                f".{f.name} = {'1.5' if (d := lookup(source.resolve_type(f.type_text))) and d.is_float else '1'}"
                for f in fields
            )
            structs.append(f"{p.name} = {{{values}}}")
            continue
        dtype = lookup(source.resolve_type(template.get(p.type_text, p.type_text)))
        value = host_args.get(p.name)
        if value is not None and _valid(value, allowed - {p.name}):
            value = _tidy(value)
            used |= Expr.parse(value).names()
        else:
            value = "1.5" if dtype is not None and dtype.is_float else "1"
            guess(kline, f"`{p.name} = {value}`: a value the file does not give")
        scalar_values[p.name] = value
    size_vars = [n for n in int_params if n in used and n not in scalar_values]
    size_vars += sorted(n for n in free if n in used and n not in size_vars)
    values: dict[str, str] = {}
    defaulted: list[str] = []
    for n in size_vars:
        text = host_args.get(n) if n in int_params else (launch.free.get(n) if launch else None)
        for _ in range(4):  # `count` passed `N`, `const int N = 1 << 22;`: 1 << 22
            if text is not None and _const(text, source) is None and launch is not None:
                text = _substitute(text, {k: v for k, v in launch.free.items() if v})
        if text is not None and (_const(text, source) or 0) > 0:
            values[n] = _tidy(text)
        else:
            values[n] = "4096" if len(size_vars) > 1 else DEFAULT_SIZE
            defaulted.append(n)
    _shrink(values, defaulted, lengths, grid, source)
    for n in defaulted:
        guess(kline, f"the size `{n} = {values[n]}`: the file gives no constant value")
    sizes = _sizes(size_vars, values, source)

    args = [f"{k} = {v}" for k, v in scalar_values.items()] + structs
    for p in kernel.params:
        if p.is_pointer:
            bound = resolved.ranges.get(p.name)
            value_range = f" in [0, {bound})" if bound in used | set(scalar_values) else ""
            args.append(f"{p.name}: {roles[p.name]} {p.type_text}[{lengths[p.name]}]{value_range}")
    lines = [f"args:   {', '.join(args)}"] if args else []
    tup = lambda xs: xs[0] if len(xs) == 1 else f"({', '.join(xs)})"  # noqa: E731
    lines.append(
        f"launch: grid = {tup(grid)}, block = {tup(block)}" + (f", smem = {smem}" if smem else "")
    )
    lines.append(f"sizes:  {sizes}")
    if template:
        lines.append("template: " + ", ".join(f"{k} = {v}" for k, v in template.items()))

    def comment() -> str:
        said = lines + [f"# guessed (line {line}): {what}" for line, what in noted]
        return "/* @optiml\n" + "".join(f" *   {line}\n" for line in said) + " */\n"

    if check:
        from optiml.cuda.validate import validate

        result = validate(source, kernel, comment(), lifted, compile=compile)
        for problem in result.problems:
            guess(kline, f"check failed: {problem}")
        for what in result.unchecked:
            guess(kline, f"not checked: {what}")
    guesses = [f"{source.path}:{line}: {what}" for line, what in noted]
    return Draft(comment(), guesses, launch.line if launch else None)


def _instantiated(source: SourceFile, kernel: Kernel) -> tuple[str, ...]:
    """The template arguments of the file's first explicit instantiation of the kernel
    (`template __global__ void k<4>(...);`), where nothing launches it."""
    if not kernel.template_params:
        return ()
    m = re.search(
        rf"\btemplate\s+(?:__global__\s+)?void\s+(?:__global__\s+)?{re.escape(kernel.name)}"
        r"\s*<([^<>]*)>\s*\(",
        source.text,
    )
    return tuple(a.strip() for a in m.group(1).split(",")) if m else ()


def _template(source: SourceFile, kernel: Kernel, given_args: tuple[str, ...]) -> dict[str, str]:
    """The instantiation: the launch's concrete template arguments, else defaults."""
    template: dict[str, str] = {}
    for i, tp in enumerate(kernel.template_params):
        given = given_args[i] if i < len(given_args) else None
        if given is not None and tp.kind == "type" and lookup(source.resolve_type(given)):
            template[tp.name] = given
        elif given is not None and tp.kind == "value" and (v := _const(given, source)) is not None:
            template[tp.name] = str(v)
        else:
            template[tp.name] = tp.default or ("float" if tp.kind == "type" else str(DEFAULT_BLOCK))
    return template


def _lift(source: SourceFile, kernel: Kernel, template: dict[str, str]):
    """The kernel's lifted model, with the signature's element types (None where it does not lift)."""
    from optiml.cuda import types as ctypes
    from optiml.lift import Lifted, lift
    from optiml.spec import BufferArg, Launch, Spec

    buffers = []
    for p in kernel.params:
        if p.is_pointer:
            t = source.resolve_type(template.get(p.type_text, p.type_text))
            d = lookup(t) or (v[0] if (v := ctypes.vector_type(t)) else None)
            if d is None:
                return None
            buffers.append(BufferArg(name=p.name, role="inout", dtype=d.code, length="1"))
    values = {k: int(v) for k, v in template.items() if re.fullmatch(r"\d+", v)}
    spec = Spec(
        kernel=kernel.name,
        params=[p.name for p in kernel.params],
        buffers=buffers,
        scalars=[],
        launch=Launch(grid=["1"], block=["1"]),
        size_vars=[],
        sizes=[],
        template={k: v for k, v in template.items() if k not in values},
        template_values=values,
    )
    try:
        lifted = lift(source, kernel, spec)
    except Exception:  # noqa: BLE001 - a model that cannot be built is drafted without it
        return None
    return lifted if isinstance(lifted, Lifted) else None


def _model_launch(source, kernel, ext, lengths, lifted, allowed) -> tuple[list[str], list[str]]:
    """grid and block from the thread indices the guards bound: `g.x < n` is cdiv(n, block.x)
    blocks, `blockIdx.x < rows` is rows blocks; the block the kernel spells
    (`blockIdx.x * 16 + threadIdx.x`) or sizes a shared array by, else 256 (16 × 16 in 2-D)."""
    from optiml.cuda.extent import raw_spelled_block

    domain = ext.domain if ext is not None else {}
    spelled = raw_spelled_block(lifted) if lifted is not None else {}
    dims = [d for d in "xyz" if f"g.{d}" in domain or f"blockIdx.{d}" in domain]
    shared = _shared_size(source, kernel, allowed)
    if not dims:
        n = next(iter(lengths.values()), "1024")
        b = shared or str(DEFAULT_BLOCK)
        return [f"cdiv({n}, {b})"], [b]
    two_d = sum(f"g.{d}" in domain for d in "xyz") > 1 or (
        dims and f"g.{dims[0]}" in domain and dims[0] != "x"
    )
    grid, block = [], []
    for d in "xyz"[: max("xyz".index(x) for x in dims) + 1]:
        b = str(
            spelled.get(d)
            or (
                16
                if two_d
                else int(shared)
                if shared and shared.isdigit()
                else shared or DEFAULT_BLOCK
            )
        )
        if f"g.{d}" in domain:
            grid.append(f"cdiv({poly_text(domain[f'g.{d}'])}, {b})")
            block.append(b)
        elif f"blockIdx.{d}" in domain:
            grid.append(poly_text(domain[f"blockIdx.{d}"]))
            block.append(b if d == "x" else "1")
        else:
            grid.append("1")
            block.append("1")
    return grid, block


def _shared_size(source: SourceFile, kernel: Kernel, allowed: set[str]) -> str | None:
    """The size of a one-dimensional `__shared__` array the body declares with a constant size
    (a block-wide reduction's scratch is one element per thread)."""
    body = source.text[kernel.body_span.start : kernel.body_span.end]
    m = re.search(r"__shared__\s+[\w:<> ]+?\s+\w+\s*\[\s*([^\]\[]+?)\s*\]\s*;", body)
    if m and _valid(m.group(1), allowed) and _const(m.group(1), source):
        return m.group(1).strip()
    return None


def _fallback_length(source: SourceFile, kernel: Kernel, int_params: list[str]) -> str:
    """With no allocation and no bounded access: the scalars the body compares indices against
    (`i < n`, `row < rows && col < cols`), multiplied; else the first integer parameter."""
    body = source.text[kernel.body_span.start : kernel.body_span.end]
    bounds = [p for p in int_params if re.search(rf"(?:<|>=)\s*{re.escape(p)}\b", body)]
    if bounds:
        return " * ".join(bounds[:2])
    return int_params[0] if int_params else "1024"


def _dtype_codes(source: SourceFile, kernel: Kernel, template: dict[str, str]) -> dict[str, str]:
    """Each pointer parameter's element type code (`u8`, `f32`)."""
    out = {}
    for p in kernel.params:
        if p.is_pointer and (
            d := lookup(source.resolve_type(template.get(p.type_text, p.type_text)))
        ):
            out[p.name] = d.code
    return out


def _value(text: str, env: dict[str, int]) -> float:
    try:
        v = Expr.parse(text).evaluate(env)
    except ExprError:
        return 0
    return v if isinstance(v, int | float) else 0


def _file_env(source: SourceFile) -> dict[str, int | float]:
    env: dict[str, int | float] = {}
    texts = {**{k: v[1] for k, v in source.macros.items() if v[0] is None}, **source.constants}
    for _ in range(4):
        for k, t in texts.items():
            if k in env:
                continue
            try:
                v = Expr.parse(t.strip()).evaluate(env)
            except ExprError:
                continue
            if isinstance(v, int | float):
                env[k] = v
    return env


def _const(text: str, source: SourceFile):
    try:
        v = Expr.parse(text).evaluate(_file_env(source))
    except ExprError:
        return None
    return v if isinstance(v, int) else None


def _sample_env(source: SourceFile, int_params: list[str], free: set[str]) -> dict[str, int]:
    """Distinct, large values for every size name: where two lengths differ, they differ here."""
    env = {k: v for k, v in _file_env(source).items() if isinstance(v, int)}
    for i, n in enumerate(sorted(set(int_params) | free)):
        env[n] = 1009 + 97 * i
    return env


def _poly_names(p: Poly) -> set[str]:
    return {a for m in p for a in m}


def _valid(text: str, allowed: set[str]) -> bool:
    try:
        e = Expr.parse(text)
    except ExprError:
        return False
    return e.names() <= allowed


def _tidy(text: str) -> str:
    text = " ".join(text.split())
    while text.startswith("(") and text.endswith(")") and _valid(text[1:-1], _names(text)):
        inner = text[1:-1]
        depth = 0
        for c in inner:
            depth += (c == "(") - (c == ")")
            if depth < 0:
                return text
        text = inner
    return text


def _substitute(text: str, mapping: dict[str, str]) -> str:
    return re.sub(
        r"\b[A-Za-z_]\w*\b",
        lambda m: f"({mapping[m.group(0)]})" if m.group(0) in mapping else m.group(0),
        text,
    )


def _names(text: str) -> set[str]:
    return set(re.findall(r"\b[A-Za-z_]\w*\b", text))


MAX_DEFAULT_ELEMENTS = 1 << 26


def _shrink(
    values: dict[str, str], guessed: list[str], lengths: dict[str, str], grid: list[str], source
) -> None:
    """Halve the sizes the file does not give until every buffer holds at most 2^26 elements and
    the grid is within the device's limits (three sizes of 4096 make a 2^36-element product)."""
    env = {k: v for k, v in _file_env(source).items() if isinstance(v, int)}
    for _ in range(40):
        for n, v in values.items():
            env[n] = _const(v, source) or 4096
        biggest = max((_value(t, env) for t in lengths.values()), default=0)
        dims = [_value(g, env) for g in grid]
        over = biggest > MAX_DEFAULT_ELEMENTS or any(
            d > (2**31 - 1 if i == 0 else 65535) for i, d in enumerate(dims)
        )
        small = [n for n in guessed if env[n] > 16]
        if not over or not small:
            return
        for n in small:
            values[n] = str(env[n] // 2)


def _sizes(size_vars: list[str], values: dict[str, str], source: SourceFile) -> str:
    """The host's value for each size (else a default) and a second size, odd, that no block
    size divides."""
    if not size_vars:
        return "_ = 1, 3"
    big = [values[n] for n in size_vars]
    odd = []
    for v in big:
        n = _const(v, source) or 4096
        m = n // 2 + 1
        odd.append(str(m if m % 2 else m + 1))
    if len(size_vars) == 1:
        return f"{size_vars[0]} = {big[0]}, {odd[0]}"
    return f"{', '.join(size_vars)} = ({', '.join(big)}), ({', '.join(odd)})"
