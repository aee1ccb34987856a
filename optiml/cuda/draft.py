"""Drafting a spec for a kernel that has none: roles from how the kernel body uses each pointer,
lengths from the host's `cudaMalloc` calls, launch configuration, sizes and scalar values from a
`<<<...>>>` launch site in the same file, and safe defaults where the file says nothing.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from optiml.cuda.source import Kernel, LaunchSite, SourceFile
from optiml.cuda.types import lookup
from optiml.expr import Expr, ExprError

_ATOMICS = re.compile(r"^atomic\w+$")
_MALLOC = re.compile(
    r"cudaMalloc(?:Managed)?\s*\(\s*(?:\(\s*void\s*\*\s*\*\s*\)\s*)?&\s*(\w+)\s*,\s*([^;]+?)\)\s*[;)]"
)
_SIZEOF = re.compile(r"\s*\*?\s*sizeof\s*\(\s*[\w\s:<>*]+\)\s*\*?\s*")
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


def _substitute(text: str, mapping: dict[str, str], rounds: int = 6) -> str:
    for _ in range(rounds):
        new = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: mapping.get(m.group(0), m.group(0)), text)
        if new == text:
            break
        text = new
    return text


def _clean(text: str) -> str:
    text = re.sub(r"\b(?:static_cast|reinterpret_cast)\s*<[^>]*>", "", text)
    text = re.sub(r"\(\s*(?:unsigned\s+)?(?:int|long|size_t|float|unsigned)\s*\)", "", text)
    text = re.sub(r"\bdim3\b", "", text)
    return " ".join(text.split())


def _valid(text: str, allowed: set[str]) -> bool:
    try:
        e = Expr.parse(text)
    except ExprError:
        return False
    return e.names() <= allowed


def draft_spec(source: SourceFile, kernel: Kernel) -> str:
    """The text of an `@optiml` comment for `kernel`, to be placed right above it."""
    site: LaunchSite | None = next(iter(source.launch_sites(kernel.name)), None)
    roles = pointer_roles(source, kernel)
    int_scalars = [
        p
        for p in kernel.params
        if not p.is_pointer
        and (d := lookup(source.resolve_type(p.type_text))) is not None
        and not d.is_float
    ]
    # Host expression -> kernel parameter, from the launch site's actual arguments.
    to_param: dict[str, str] = {}
    host_value: dict[str, str] = {}
    if site is not None:
        for p, actual in zip(kernel.params, site.args, strict=False):
            a = actual.strip()
            if re.fullmatch(r"[A-Za-z_]\w*", a):
                to_param[a] = p.name
            host_value[p.name] = a
    bindings = dict(site.bindings) if site else {}

    def host_to_spec(text: str) -> str:
        resolved = _substitute(
            _clean(text), {k: v for k, v in bindings.items() if k not in to_param}
        )
        return _clean(_substitute(resolved, to_param, rounds=1))

    template: dict[str, str] = {}
    for i, tp in enumerate(kernel.template_params):
        given = site.template_args[i] if site and i < len(site.template_args) else None
        # A launch inside a host template passes its own parameters on: only concrete ones count.
        concrete = given is not None and (
            lookup(given) is not None
            if tp.kind == "type"
            else _literal(given, bindings) is not None
        )
        if concrete:
            template[tp.name] = given if tp.kind == "type" else _literal(given, bindings)
        else:
            template[tp.name] = tp.default or ("float" if tp.kind == "type" else str(DEFAULT_BLOCK))
    template_ints = {k for k, v in template.items() if re.fullmatch(r"\d+", v)}

    # Lengths: cudaMalloc(&d_x, N * sizeof(float)) with d_x passed as parameter x.
    lengths: dict[str, str] = {}
    for m in _MALLOC.finditer(source.text):
        var, nbytes = m.group(1), m.group(2)
        param = to_param.get(var)
        if param is None:
            continue
        nbytes = _substitute(
            nbytes, {k: v for k, v in bindings.items() if k not in to_param}, rounds=2
        )
        elems = _SIZEOF.sub(" ", nbytes).strip().strip("*").strip()
        lengths[param] = host_to_spec(elems) if elems else "1"
    size_names = {p.name for p in int_scalars}
    fallback = _fallback_length(source, kernel, int_scalars)
    for p in kernel.params:
        if p.is_pointer and (
            p.name not in lengths or not _valid(lengths[p.name], size_names | template_ints)
        ):
            lengths[p.name] = fallback

    # Launch configuration.
    grid, block, smem = None, None, None
    if site is not None and len(site.config) >= 2:
        grid, block = host_to_spec(site.config[0]), host_to_spec(site.config[1])
        smem = host_to_spec(site.config[2]) if len(site.config) >= 3 else None
        allowed = size_names | template_ints
        if not _valid(grid, allowed) or not _valid(block, allowed):
            grid, block = None, None
        if smem is not None and (not _valid(smem, allowed) or smem.strip() == "0"):
            smem = None
    if grid is None:
        block = str(DEFAULT_BLOCK)
        grid = f"cdiv({fallback}, {DEFAULT_BLOCK})"

    # Which integer scalars are sizes: those the lengths or the launch use.
    used = set()
    for text in [*lengths.values(), grid, block, smem or "0"]:
        used |= Expr.parse(text).names()
    size_vars = [p.name for p in int_scalars if p.name in used]
    scalars: list[str] = []
    for p in kernel.params:
        if p.is_pointer or p.name in size_vars:
            continue
        fields = source.structs.get(source.resolve_type(template.get(p.type_text, p.type_text)))
        if fields is not None:
            values = ", ".join(
                f".{f.name} = {'1.5' if (d := lookup(source.resolve_type(f.type_text))) and d.is_float else '1'}"
                for f in fields
            )
            scalars.append(f"{p.name} = {{{values}}}")
            continue
        value = _literal(host_value.get(p.name), bindings)
        dtype = lookup(source.resolve_type(template.get(p.type_text, p.type_text)))
        if value is None:
            value = "1.5" if dtype is not None and dtype.is_float else "1"
        scalars.append(f"{p.name} = {value}")

    sizes = _sizes(size_vars, host_value, bindings, block)
    args = list(scalars)
    for p in kernel.params:
        if p.is_pointer:
            t = p.type_text
            args.append(f"{p.name}: {roles[p.name]} {t}[{lengths[p.name]}]")
    lines = [f"args:   {', '.join(args)}"] if args else []
    launch = f"grid = {grid}, block = {block}" + (f", smem = {smem}" if smem else "")
    lines.append(f"launch: {launch}")
    lines.append(f"sizes:  {sizes}")
    if template:
        lines.append("template: " + ", ".join(f"{k} = {v}" for k, v in template.items()))
    return "/* @optiml\n" + "".join(f" *   {line}\n" for line in lines) + " */\n"


def _literal(text: str | None, bindings: dict[str, str]) -> str | None:
    if text is None:
        return None
    value = _clean(_substitute(text, bindings))
    try:
        v = Expr.parse(value).evaluate({})
    except ExprError:
        return None
    return repr(v) if isinstance(v, float) else str(v) if isinstance(v, int) else None


def _fallback_length(source: SourceFile, kernel: Kernel, int_scalars) -> str:
    """With no allocation to go by: the scalars the body compares indices against (`i < n`,
    `row < rows && col < cols`), multiplied; else the first integer parameter."""
    body = source.text[kernel.body_span.start : kernel.body_span.end]
    bounds = [p.name for p in int_scalars if re.search(rf"(?:<|>=)\s*{re.escape(p.name)}\b", body)]
    if bounds:
        return " * ".join(bounds[:2])
    return int_scalars[0].name if int_scalars else "1024"


def _sizes(
    size_vars: list[str], host_value: dict[str, str], bindings: dict[str, str], block: str
) -> str:
    """The host's value for each size (else a default) and a second size that is not a multiple of
    the block."""
    if not size_vars:
        return "_ = 1, 3"
    big = []
    for name in size_vars:
        host = host_value.get(name)
        v = _literal(host, bindings)
        if v is not None and v.isdigit():
            # Keep the host's own spelling (`1 << 22`) where it is a plain expression.
            text = _clean(_substitute(host, bindings))
            big.append(text if _valid(text, set()) else v)
        else:
            big.append("4096" if len(size_vars) > 1 else DEFAULT_SIZE)
    odd = []
    for v in big:
        n = Expr.parse(v).evaluate({})
        m = n // 2 + 1
        odd.append(str(m if m % 2 else m + 1))
    if len(size_vars) == 1:
        return f"{size_vars[0]} = {big[0]}, {odd[0]}"
    return f"{', '.join(size_vars)} = ({', '.join(big)}), ({', '.join(odd)})"
