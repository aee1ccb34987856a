"""Reading a file's host code for a kernel's spec: its launch (`<<<grid, block[, smem[, stream]]>>>`
in any function, through one wrapper function called with arguments), the buffers passed to it
and their allocations in all their usual spellings, and the values of the host's variables.

Every host expression is translated from its syntax tree into the spec's expression language
(`optiml.expr`): a host variable passed to the kernel becomes the kernel's parameter, a variable
assigned earlier becomes its value, a file macro or constant stays itself (the spec reads them),
`dim3 g(a, b)` becomes the tuple `(a, b)`, `v.size()` the length of the container `v`,
`ceil(n / 256.0)` becomes `cdiv(n, 256)`, casts go. What cannot be translated raises `Unread`.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

from tree_sitter import Node

from optiml.cuda.source import Kernel, SourceFile
from optiml.cuda.types import lookup, normalize_c_type, vector_type
from optiml.expr import Expr, ExprError

MALLOCS = ("cudaMalloc", "cudaMallocManaged", "cudaMallocAsync", "cudaMallocHost", "cudaHostAlloc")
CONTAINERS = ("vector", "device_vector", "host_vector", "universal_vector", "unique_ptr")
MAX_DEPTH = 24  # variables whose values name other variables, followed at most this deep


class Unread(Exception):
    """A host expression the translation does not follow (a function's result, a loop's value)."""


@dataclass
class Scope:
    """Where a host expression is read: its function (for the values of variables assigned
    before `at`), and for a wrapper function, its parameters' arguments at the call that the
    launch is reached through."""

    fn: Node | None
    at: int
    params: dict[str, tuple[Node, Scope]] = field(default_factory=dict)


@dataclass
class HostLaunch:
    """A launch of the kernel, its configuration and arguments translated to spec expressions."""

    line: int  # 1-based, of the `<<<...>>>` call
    sites: int  # how many launches of the kernel the file has (the first is read)
    grid: list[str] | None  # components, or None where the text could not be read
    block: list[str] | None
    smem: str | None
    args: dict[str, str]  # kernel parameter -> its argument, translated (where it could be)
    buffers: dict[str, str]  # pointer parameter -> host variable holding the buffer
    lengths: dict[str, str]  # pointer parameter -> its allocation's length in elements
    free: dict[str, str | None]  # host names left in the texts -> their constant value, if any
    guessed: list[str] = field(default_factory=list)  # what was read with less than certainty
    wrapper: str | None = None  # the function the launch is in, where it is not `main`


class HostReader:
    def __init__(self, source: SourceFile, kernel: Kernel):
        self.source = source
        self.kernel = kernel
        self.text = source.node_text
        self.functions = self._host_functions()
        self.free: dict[str, str | None] = {}
        self.guessed: list[str] = []
        self.param_of: dict[str, str] = {}  # translated argument text -> kernel parameter

    # ---- the tree ---------------------------------------------------------------------------

    def _host_functions(self) -> dict[str, Node]:
        out: dict[str, Node] = {}
        stack = [self.source.tree.root_node]
        while stack:
            n = stack.pop()
            if n.type == "function_definition":
                quals = {c.type for c in n.children if not c.is_named}
                if not quals & {"__global__", "__device__"}:
                    d = n.child_by_field_name("declarator")
                    while d is not None and d.type != "function_declarator":
                        d = d.child_by_field_name("declarator")
                    name = d.child_by_field_name("declarator") if d is not None else None
                    if name is not None:
                        out.setdefault(self.text(name).rsplit("::", 1)[-1], n)
                continue
            stack.extend(reversed(n.named_children))
        return out

    def _enclosing(self, node: Node) -> Node | None:
        while node is not None and node.type != "function_definition":
            node = node.parent
        return node

    def _fn_name(self, fn: Node) -> str:
        d = fn.child_by_field_name("declarator")
        while d is not None and d.type != "function_declarator":
            d = d.child_by_field_name("declarator")
        name = d.child_by_field_name("declarator") if d is not None else None
        return self.text(name).rsplit("::", 1)[-1] if name is not None else ""

    def _param_names(self, fn: Node) -> list[str]:
        d = fn.child_by_field_name("declarator")
        while d is not None and d.type != "function_declarator":
            d = d.child_by_field_name("declarator")
        plist = d.child_by_field_name("parameters") if d is not None else None
        names = []
        for p in plist.named_children if plist is not None else []:
            x = p.child_by_field_name("declarator")
            while x is not None and x.type != "identifier":
                x = x.child_by_field_name("declarator")
            names.append(self.text(x) if x is not None else "")
        return names

    def _calls(self, root: Node, names: tuple[str, ...]) -> list[Node]:
        out, stack = [], [root]
        while stack:
            n = stack.pop()
            if n.type == "call_expression":
                f = n.child_by_field_name("function")
                if f is not None and self.text(f).rsplit("::", 1)[-1] in names:
                    out.append(n)
            stack.extend(reversed(n.named_children))
        return sorted(out, key=lambda n: n.start_byte)

    # ---- the launch -------------------------------------------------------------------------

    def launch(self) -> HostLaunch | None:
        sites = [
            n
            for n in self.source._launch_nodes
            if self._callee(n).rsplit("::", 1)[-1] == self.kernel.short_name
        ]
        if not sites:
            return None
        call = sites[0]
        fn = self._enclosing(call)
        scope = Scope(fn, call.start_byte)
        wrapper = None
        if fn is not None and self._fn_name(fn) != "main":
            wrapper = self._fn_name(fn)
            scope.params = self._wrapper_arguments(fn)
        config = next(c for c in call.named_children if c.type == "kernel_call_syntax")
        args_node = call.child_by_field_name("arguments")
        actuals = list(args_node.named_children) if args_node is not None else []
        args: dict[str, str] = {}
        buffers: dict[str, str] = {}
        lengths: dict[str, str] = {}
        # scalars first: their texts name the parameters in every other expression
        for p, a in zip(self.kernel.params, actuals, strict=False):
            if p.is_pointer:
                continue
            try:
                args[p.name] = self.expr(a, scope)
            except Unread:
                continue
        for name, t in args.items():
            self.param_of.setdefault(_norm(t), name)
        for p, a in zip(self.kernel.params, actuals, strict=False):
            if not p.is_pointer:
                continue
            found = self._buffer(a, scope)
            if found is None:
                continue
            var, var_scope = found
            buffers[p.name] = var
            length = self.allocation(var, var_scope, self._elem_size(p.type_text))
            if length is not None:
                lengths[p.name] = length
        grid = block = smem = None
        parts = config.named_children
        with contextlib.suppress(Unread):
            grid = self.dims(parts[0], scope) if parts else None
        with contextlib.suppress(Unread):
            block = self.dims(parts[1], scope) if len(parts) > 1 else None
        if len(parts) > 2:
            try:
                smem = self.expr(parts[2], scope)
            except Unread:
                self.guessed.append(f"line {_line(parts[2])}: dynamic shared memory not read")
        return HostLaunch(
            line=_line(call),
            sites=len(sites),
            grid=grid,
            block=block,
            smem=smem,
            args=args,
            buffers=buffers,
            lengths=lengths,
            free=self.free,
            guessed=self.guessed,
            wrapper=wrapper,
        )

    def _callee(self, call: Node) -> str:
        f = call.child_by_field_name("function")
        if f is None:
            return ""
        while f.type == "qualified_identifier" and f.child_by_field_name("name") is not None:
            f = f.child_by_field_name("name")
        if f.type == "template_function":
            f = f.child_by_field_name("name")
        return self.text(f)

    def _wrapper_arguments(self, fn: Node) -> dict[str, tuple[Node, Scope]]:
        """The wrapper's parameters -> the arguments of its first call in another function."""
        name = self._fn_name(fn)
        for other in self.functions.values():
            if other == fn:
                continue
            for call in self._calls(other, (name,)):
                args = call.child_by_field_name("arguments")
                actuals = args.named_children if args is not None else []
                outer = Scope(other, call.start_byte)
                return {
                    p: (a, outer) for p, a in zip(self._param_names(fn), actuals, strict=False) if p
                }
        return {}

    def dims(self, node: Node, scope: Scope) -> list[str]:
        """A grid or block: its components (1 to 3)."""
        node = _unparen(node)
        if node.type == "identifier":
            name = self.text(node)
            if name in scope.params:
                arg, outer = scope.params[name]
                return self.dims(arg, outer)
            value = self._value(name, scope)
            if value is not None:
                v, vscope, dim3 = value
                if dim3 is not None:
                    return [self.expr(c, vscope) for c in dim3] or ["1"]
                if _unparen(v).type not in ("identifier", "call_expression", "initializer_list"):
                    # `int blocks = 2048;`: a number, kept by the host's name like any size
                    return [self.expr(node, scope)]
                return self.dims(v, vscope)
        if node.type == "call_expression" and self._callee(node) == "dim3":
            args = node.child_by_field_name("arguments")
            return [self.expr(c, scope) for c in args.named_children] if args else ["1"]
        if node.type in ("initializer_list", "compound_literal_expression"):
            items = node.named_children
            if node.type == "compound_literal_expression":
                items = node.child_by_field_name("value").named_children
            return [self.expr(c, scope) for c in items]
        return [self.expr(node, scope)]

    # ---- values of variables ----------------------------------------------------------------

    def _value(self, name: str, scope: Scope):
        """The last value given to `name` in its function before `scope.at` that can be read
        (an assignment whose value cannot be read, such as `n = atoi(argv[1])` under an `if`,
        does not hide the one before it); (node, scope, dim3 components or None)."""
        if scope.fn is None:
            return None
        body = scope.fn.child_by_field_name("body")
        found: list[tuple[int, Node, list[Node] | None]] = []
        stack = [body] if body is not None else []
        while stack:
            n = stack.pop()
            if n.start_byte >= scope.at:
                continue
            if n.type == "declaration":
                dim3 = self.text(n.child_by_field_name("type")) == "dim3"
                for d in n.children_by_field_name("declarator"):
                    if dim3 and d.type == "function_declarator":  # `dim3 b(TILE, TILE);`
                        target = d.child_by_field_name("declarator")
                        plist = d.child_by_field_name("parameters")
                        if target is not None and self.text(target) == name and plist:
                            parts = [
                                c.child_by_field_name("type") or c for c in plist.named_children
                            ]
                            found.append((n.start_byte, plist, parts))
                        continue
                    if d.type != "init_declarator":
                        continue
                    target, value = (
                        d.child_by_field_name("declarator"),
                        d.child_by_field_name("value"),
                    )
                    if target is None or value is None or self.text(target) != name:
                        continue
                    if dim3 and value.type in ("argument_list", "initializer_list"):
                        found.append((n.start_byte, value, list(value.named_children)))
                    elif value.type == "argument_list" and len(value.named_children) == 1:
                        found.append((n.start_byte, value.named_children[0], None))
                    elif value.type not in ("argument_list", "initializer_list"):
                        found.append((n.start_byte, value, None))
            elif n.type == "assignment_expression":
                left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
                op = n.child_by_field_name("operator")
                if (
                    left is not None
                    and right is not None
                    and self.text(left) == name
                    and (op is None or self.text(op) == "=")
                ):
                    found.append((n.start_byte, right, None))
            stack.extend(n.named_children)
        for _, node, dim3 in sorted(found, key=lambda f: -f[0]):
            inner = Scope(scope.fn, node.start_byte, scope.params)
            try:
                if dim3 is None:
                    self.expr(node, inner, _probe=True)
                return node, inner, dim3
            except Unread:
                self.guessed.append(
                    f"line {_line(node)}: `{name} = {self.text(node)}` not read; "
                    "an earlier value taken"
                )
                continue
        return None

    # ---- expressions ------------------------------------------------------------------------

    def expr(self, node: Node, scope: Scope, depth: int = 0, _probe: bool = False) -> str:
        text = self._expr(node, scope, depth)
        if not _probe:
            match = self.param_of.get(_norm(text))
            if match is not None and node.type != "number_literal":
                return match
        return text

    def _expr(self, node: Node, scope: Scope, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise Unread(f"line {_line(node)}: values nested too deeply")
        t = node.type
        if t == "number_literal":
            return _number(self.text(node))
        if t == "parenthesized_expression":
            inner = node.named_children[-1]
            return f"({self.expr(inner, scope, depth + 1)})"
        if t == "identifier":
            return self._name(self.text(node), scope, depth)
        if t == "binary_expression":
            op = self.text(node.child_by_field_name("operator"))
            if op not in ("+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^"):
                raise Unread(f"line {_line(node)}: `{op}`")
            a = self.expr(node.child_by_field_name("left"), scope, depth + 1)
            b = self.expr(node.child_by_field_name("right"), scope, depth + 1)
            return f"{a} {op} {b}"
        if t == "unary_expression":
            op = self.text(node.child_by_field_name("operator"))
            if op not in ("-", "+", "~"):
                raise Unread(f"line {_line(node)}: `{op}`")
            return op + self.expr(node.child_by_field_name("argument"), scope, depth + 1)
        if t == "cast_expression":
            return self.expr(node.child_by_field_name("value"), scope, depth + 1)
        if t == "sizeof_expression":
            size = self._sizeof(node)
            if size is None:
                raise Unread(f"line {_line(node)}: `{self.text(node)}`")
            return str(size)
        if t == "call_expression":
            return self._call(node, scope, depth)
        if t == "field_expression" and self.text(node.child_by_field_name("field")) in (
            "multiProcessorCount",
        ):
            return "sm_count"
        if t == "field_expression" and (dim := self._dim3_component(node, scope, depth)):
            return dim
        if t == "conditional_expression":
            raise Unread(f"line {_line(node)}: a conditional value")
        raise Unread(f"line {_line(node)}: `{self.text(node)}`")

    def _dim3_component(self, node: Node, scope: Scope, depth: int) -> str | None:
        """`threads.x` of `dim3 threads(32, 8)`: 32 (a component not given is 1)."""
        field_name = self.text(node.child_by_field_name("field"))
        owner = node.child_by_field_name("argument")
        if field_name not in ("x", "y", "z") or owner is None or owner.type != "identifier":
            return None
        value = self._value(self.text(owner), scope)
        if value is None or value[2] is None:
            return None
        _, vscope, parts = value
        i = "xyz".index(field_name)
        return f"({self.expr(parts[i], vscope, depth + 1)})" if i < len(parts) else "1"

    def _name(self, name: str, scope: Scope, depth: int) -> str:
        if name in scope.params:
            arg, outer = scope.params[name]
            return self.expr(arg, outer, depth + 1)
        value = self._value(name, scope)
        if value is not None and value[2] is None:
            v, vscope, _ = value
            text = self.expr(v, vscope, depth + 1)
            if re.fullmatch(r"[A-Za-z_]\w*", text) or _constant(text) is None:
                return text if _simple(text) else f"({text})"
            # a host variable with a constant value: a size, named as the host names it
            self.free.setdefault(name, text)
            return name
        if name in self.source.macros and self.source.macros[name][0] is None:
            body = self.source.macros[name][1]
            if _valid(body, set(self.source.macros) | set(self.source.constants)):
                return name  # the spec reads the file's macros itself
        if name in self.source.constants:
            return name
        if name in ("warpSize",):
            return "32"
        self.free.setdefault(name, None)
        return name

    def _call(self, node: Node, scope: Scope, depth: int) -> str:
        callee = self._callee(node)
        args_node = node.child_by_field_name("arguments")
        args = list(args_node.named_children) if args_node is not None else []
        f = node.child_by_field_name("function")
        if callee in ("static_cast", "reinterpret_cast", "int", "size_t", "unsigned") and args:
            return self.expr(args[0], scope, depth + 1)
        if callee == "size" and f is not None and f.type == "field_expression":
            owner = f.child_by_field_name("argument")
            length = self._container_length(self.text(owner), scope)
            if length is None:
                raise Unread(f"line {_line(node)}: the size of `{self.text(owner)}`")
            return length
        if callee in ("ceil", "ceilf", "std::ceil") and len(args) == 1:
            inner = _unparen(args[0])
            while inner.type == "cast_expression":
                inner = _unparen(inner.child_by_field_name("value"))
            if (
                inner.type == "binary_expression"
                and self.text(inner.child_by_field_name("operator")) == "/"
            ):
                a = self.expr(inner.child_by_field_name("left"), scope, depth + 1)
                b = self.expr(inner.child_by_field_name("right"), scope, depth + 1)
                return f"cdiv({_int_text(a)}, {_int_text(b)})"
        if callee in ("min", "max", "std::min", "std::max") and len(args) >= 2:
            inner = ", ".join(self.expr(a, scope, depth + 1) for a in args)
            return f"{callee.rsplit(':', 1)[-1]}({inner})"
        macro = self.source.macros.get(callee)
        if macro is not None and macro[0] is not None and len(macro[0]) == len(args):
            # a function-like macro (`DIV_UP(a, b)`): its body with the arguments put in
            mapping = {
                p: f"({self.expr(a, scope, depth + 1)})"
                for p, a in zip(macro[0], args, strict=True)
            }
            body = re.sub(
                r"\b[A-Za-z_]\w*\b", lambda m: mapping.get(m.group(0), m.group(0)), macro[1]
            )
            if _valid(body, set(self.free) | set(self.param_of.values()) | _names(body)):
                return f"({body})"
        if callee in self.functions and len(args) == len(self._param_names(self.functions[callee])):
            ret = self._returned(self.functions[callee])
            if ret is not None:  # `int cdiv(int a, int b) { return (a + b - 1) / b; }`
                params = {
                    p: (a, scope)
                    for p, a in zip(self._param_names(self.functions[callee]), args, strict=True)
                }
                return f"({self.expr(ret, Scope(self.functions[callee], ret.start_byte, params), depth + 1)})"
        raise Unread(f"line {_line(node)}: `{self.text(node)}`")

    def _returned(self, fn: Node) -> Node | None:
        """The value of a host function whose body is one `return EXPR;`."""
        body = fn.child_by_field_name("body")
        stmts = [c for c in body.named_children if c.type != "comment"] if body else []
        if len(stmts) == 1 and stmts[0].type == "return_statement" and stmts[0].named_children:
            return stmts[0].named_children[0]
        return None

    def _sizeof(self, node: Node) -> int | None:
        t = node.child_by_field_name("type")
        text = self.text(t) if t is not None else self.text(node)[6:].strip("() ")
        return type_size(self.source, text)

    # ---- buffers and their allocations ------------------------------------------------------

    def _buffer(self, node: Node, scope: Scope) -> tuple[str, Scope] | None:
        """The host variable a pointer argument comes from: `d_x`, `x.data()`,
        `thrust::raw_pointer_cast(v.data())`, `&v[0]`, `v.data().get()`, `(float*)d`."""
        for _ in range(MAX_DEPTH):
            node = _unparen(node)
            if node.type == "identifier":
                name = self.text(node)
                if name in scope.params:
                    node, scope = scope.params[name]
                    continue
                return name, scope
            if node.type == "cast_expression":
                node = node.child_by_field_name("value")
            elif (
                node.type == "pointer_expression"
                or node.type == "subscript_expression"
                or node.type == "field_expression"
            ):
                node = node.child_by_field_name("argument")
            elif node.type == "call_expression":
                f = node.child_by_field_name("function")
                args = node.child_by_field_name("arguments")
                if f is not None and f.type == "field_expression":
                    node = f.child_by_field_name("argument")
                elif args is not None and args.named_children:
                    node = args.named_children[0]
                else:
                    return None
            else:
                return None
        return None

    def allocation(self, var: str, scope: Scope, elem_size: int | None) -> str | None:
        """The length in elements of the buffer `var` names: its `cudaMalloc*` (any pointer
        expression for it), container (`std::vector<T> v(n)`, `thrust::device_vector<T> v(n)`),
        `new T[n]`, `malloc`, else the bytes of a `cudaMemcpy` into or out of it."""
        fns = [scope.fn] if scope.fn is not None else []
        fns += [f for f in self.functions.values() if f not in fns]
        for fn in fns:
            inner = Scope(fn, 1 << 62, scope.params if fn == scope.fn else {})
            for call in self._calls(fn, MALLOCS + ("cudaMallocPitch",)):
                args = call.child_by_field_name("arguments").named_children
                if len(args) < 2 or self._pointee(args[0]) != var:
                    continue
                inner.at = call.start_byte
                if self._callee(call) == "cudaMallocPitch" and len(args) >= 4:
                    self.guessed.append(
                        f"line {_line(call)}: `{var}` is pitched; its length is read as "
                        "width × height, without the padding"
                    )
                    try:
                        w = self._elements(args[2], inner, elem_size)
                        h = self.expr(args[3], inner)
                        return f"{_wrap(w)} * {_wrap(h)}"
                    except Unread:
                        return None
                try:
                    return self._elements(args[1], inner, elem_size)
                except Unread as e:
                    self.guessed.append(f"{e}: the allocation of `{var}` not read")
                    return None
            try:
                length = self._container_length(var, Scope(fn, 1 << 62, inner.params))
            except Unread:
                length = None
            if length is not None:
                return length
        for fn in fns:
            for call in self._calls(fn, ("cudaMemcpy", "cudaMemcpyAsync")):
                args = call.child_by_field_name("arguments").named_children
                if len(args) >= 3 and var in (self._pointee(args[0], 0), self._pointee(args[1], 0)):
                    try:
                        return self._elements(args[2], Scope(fn, call.start_byte), elem_size)
                    except Unread:
                        continue
        return None

    def _pointee(self, node: Node, address: int = 1) -> str | None:
        """`d` for `&d`, `(void**)&d`, `reinterpret_cast<void**>(&d)`, `&s.d` (`address`: 1 for
        the first argument of a cudaMalloc, 0 for a pointer itself)."""
        for _ in range(MAX_DEPTH):
            node = _unparen(node)
            if node.type == "cast_expression":
                node = node.child_by_field_name("value")
            elif node.type == "call_expression" and self._callee(node) in (
                "reinterpret_cast",
                "static_cast",
                "thrust::raw_pointer_cast",
                "raw_pointer_cast",
            ):
                node = node.child_by_field_name("arguments").named_children[0]
            elif node.type == "pointer_expression" and self.text(node).startswith("&"):
                address -= 1
                node = node.child_by_field_name("argument")
            elif node.type == "identifier" and address <= 0:
                return self.text(node)
            elif node.type == "field_expression" and address <= 0:
                return self.text(node.child_by_field_name("field"))
            elif node.type == "call_expression":  # `v.data()`
                f = node.child_by_field_name("function")
                if f is None or f.type != "field_expression":
                    return None
                node = f.child_by_field_name("argument")
            else:
                return None
        return None

    def _elements(self, nbytes: Node, scope: Scope, elem_size: int | None) -> str:
        """A byte count as a count of elements: the `sizeof` factor taken out of a product
        (through variables holding the product), else the bytes divided by the element's size."""
        nbytes = _unparen(nbytes)
        if nbytes.type == "identifier" and self.text(nbytes) not in scope.params:
            value = self._value(self.text(nbytes), scope)
            if value is not None and value[2] is None:
                return self._elements(value[0], value[1], elem_size)
        if nbytes.type == "identifier" and self.text(nbytes) in scope.params:
            arg, outer = scope.params[self.text(nbytes)]
            return self._elements(arg, outer, elem_size)
        factors = _product(nbytes)
        for i, f in enumerate(factors):
            f = _unparen(f)
            if f.type == "sizeof_expression" and (
                elem_size is None or self._sizeof(f) in (elem_size, None)
            ):
                rest = [self.expr(x, scope) for j, x in enumerate(factors) if j != i]
                return " * ".join(_wrap(r) for r in rest) if rest else "1"
        if elem_size is None:
            raise Unread(f"line {_line(nbytes)}: bytes of an unknown element type")
        return f"({self.expr(nbytes, scope)}) / {elem_size}"

    def _container_length(self, var: str, scope: Scope) -> str | None:
        """`std::vector<T> v(n)`, `thrust::device_vector<T> v(n)`, `T* p = new T[n]`,
        `T* p = (T*)malloc(n * sizeof(T))`: the length of `v` or `p` in elements."""
        if scope.fn is None:
            return None
        stack = [scope.fn.child_by_field_name("body")]
        while stack:
            n = stack.pop()
            if n is None:
                continue
            if n.type == "declaration":
                type_text = self.text(n.child_by_field_name("type"))
                for d in n.children_by_field_name("declarator"):
                    got = self._declared_length(type_text, d, var, scope)
                    if got is not None:
                        return got
            stack.extend(n.named_children)
        return None

    def _declared_length(self, type_text: str, d: Node, var: str, scope: Scope) -> str | None:
        template = re.match(r"(?:\w+::)*(\w+)\s*<\s*(.+)>\s*$", type_text)
        inner = Scope(scope.fn, d.start_byte, scope.params)
        if template and template.group(1) in CONTAINERS:
            # `thrust::device_vector<float> v(n)` reads as a function declaration
            if d.type == "function_declarator":
                name, args = (
                    d.child_by_field_name("declarator"),
                    d.child_by_field_name("parameters"),
                )
                if name is not None and self.text(name) == var and args and args.named_children:
                    first = args.named_children[0]
                    return self.expr(first.child_by_field_name("type") or first, inner)
            if d.type == "init_declarator":
                name, value = d.child_by_field_name("declarator"), d.child_by_field_name("value")
                if (
                    name is not None
                    and self.text(name) == var
                    and value is not None
                    and value.type in ("argument_list", "initializer_list")
                    and value.named_children
                ):
                    if value.type == "initializer_list" and len(value.named_children) > 1:
                        return str(len(value.named_children))
                    return self.expr(value.named_children[0], inner)
            return None
        if d.type != "init_declarator":
            return None
        target, value = d.child_by_field_name("declarator"), d.child_by_field_name("value")
        while target is not None and target.type == "pointer_declarator":
            target = target.child_by_field_name("declarator")
        if target is None or self.text(target) != var or value is None:
            return None
        value = _unparen(value)
        while value.type == "cast_expression":
            value = _unparen(value.child_by_field_name("value"))
        if value.type == "new_expression":
            nd = value.child_by_field_name("declarator")
            if nd is not None and nd.named_children:
                return self.expr(nd.named_children[0], inner)
        if value.type == "call_expression" and self._callee(value) in ("malloc", "calloc"):
            args = value.child_by_field_name("arguments").named_children
            if self._callee(value) == "calloc" and len(args) == 2:
                return self.expr(args[0], inner)
            if args:
                return self._elements(args[0], inner, type_size(self.source, type_text))
        return None

    def _elem_size(self, type_text: str) -> int | None:
        return type_size(self.source, type_text)


def type_size(source: SourceFile, text: str) -> int | None:
    """The size in bytes of a type the file names (`float`, `floatX`, `float4`, `T*`)."""
    text = " ".join(text.replace("const ", "").split())
    if text.endswith("*"):
        return 8
    resolved = source.resolve_type(text)
    d = lookup(normalize_c_type(resolved))
    if d is not None:
        return d.size
    v = vector_type(resolved)
    if v is not None:
        return v[0].size * v[1]
    return None


def _product(node: Node) -> list[Node]:
    node = _unparen(node)
    if node.type == "binary_expression" and node.child_by_field_name("operator").type == "*":
        return _product(node.child_by_field_name("left")) + _product(
            node.child_by_field_name("right")
        )
    return [node]


def _unparen(node: Node) -> Node:
    while node.type == "parenthesized_expression" and node.named_children:
        node = node.named_children[-1]
    return node


def _line(node: Node) -> int:
    return node.start_point[0] + 1


def _number(text: str) -> str:
    t = text.replace("'", "")
    if re.fullmatch(r"0[xX][0-9a-fA-F]+[uUlL]*", t):
        return t.rstrip("uUlL")
    if re.fullmatch(r"\d+[uUlL]*", t):
        return t.rstrip("uUlL")
    return t.rstrip("fFlL") if re.search(r"[.eE]", t) else t


def _int_text(text: str) -> str:
    """`256.0` -> `256` (a float literal in a `ceil(n / 256.0)`)."""
    return re.sub(r"\b(\d+)\.0*\b", r"\1", text)


def _norm(text: str) -> str:
    return "".join(text.split()).strip("()") if text else text


def _simple(text: str) -> bool:
    return bool(re.fullmatch(r"[\w.]+|\(.*\)", text.strip())) and _balanced(text.strip())


def _balanced(text: str) -> bool:
    if not text.startswith("("):
        return True
    depth = 0
    for i, c in enumerate(text):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and i < len(text) - 1:
            return False
    return True


def _wrap(text: str) -> str:
    return text if _simple(text) else f"({text})"


def _names(text: str) -> set[str]:
    return set(re.findall(r"\b[A-Za-z_]\w*\b", text))


def _valid(text: str, allowed: set[str]) -> bool:
    try:
        e = Expr.parse(text)
    except ExprError:
        return False
    return e.names() <= allowed


def _constant(text: str):
    try:
        return Expr.parse(text).evaluate({})
    except ExprError:
        return None
