"""The source model: a `.cu` file parsed by tree-sitter-cuda into kernels, their signatures, spec
comments, ranges and `<<<...>>>` launch sites, and the translation unit that compiles one kernel
without the user's `main`.

Positions are 0-based (line, character) internally, like LSP; `Position` (1-based) is made at the edge.
"""

from __future__ import annotations

import bisect
import difflib
import re
import threading
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import tree_sitter_cuda
from tree_sitter import Language, Node, Parser, Query, QueryCursor, Tree

from optiml.errors import InputFileError, NoSuchKernel, Position, SourceWarning


def no_kernel_message(path: str) -> str:
    return f"no kernel in {path}: it defines no __global__ function"


_CUDA = Language(tree_sitter_cuda.language())
# a kernel launch: a call with `<<<...>>>`
_LAUNCHES = Query(_CUDA, "(call_expression (kernel_call_syntax)) @launch")


_THREAD = threading.local()


def _parser() -> Parser:
    """This thread's parser (a tree-sitter parser is not to be shared between threads)."""
    parser = getattr(_THREAD, "parser", None)
    if parser is None:
        parser = _THREAD.parser = Parser(_CUDA)
    return parser


def _parse(data: bytes, previous: SourceFile | None) -> Tree:
    """`data`'s tree, from `previous`'s where there is one."""
    return _parser().parse(data) if previous is None else reparse(previous, data)[1]


def reparse(previous: SourceFile, data: bytes) -> tuple[Tree, Tree]:
    """`data` (the UTF-8 of a later version of `previous`'s text) parsed incrementally: a copy of
    `previous`'s tree edited by the one region in which the texts differ (what tree-sitter compares
    a new tree with: `edited.changed_ranges(new)`), and the new tree, parsed from it."""
    return reparse_tree(previous._bytes, previous.tree, data)


def reparse_tree(
    old: bytes, old_tree: Tree, data: bytes, region: tuple[int, int, int] | None = None
) -> tuple[Tree, Tree]:
    """`reparse` of a text's UTF-8 and tree; `region`: `changed(old, data)` where the caller has
    it."""
    start, old_end, new_end = region or changed(old, data)
    tree = old_tree.copy()
    if start == old_end == new_end:
        return tree, old_tree
    tree.edit(
        start,
        old_end,
        new_end,
        _byte_point(old, start),
        _byte_point(old, old_end),
        _byte_point(data, new_end),
    )
    return tree, _parser().parse(data, tree)


def _byte_point(data: bytes, offset: int) -> tuple[int, int]:
    """tree-sitter's point of a byte offset: its row and its byte column."""
    return data.count(b"\n", 0, offset), offset - (data.rfind(b"\n", 0, offset) + 1)


_BLOCK = 1 << 16  # bytes or characters compared at a time in looking for where two texts differ


def changed(a: str | bytes, b: str | bytes) -> tuple[int, int, int]:
    """The one region in which `a` and `b` differ: it starts at `start` in both and ends at `a_end`
    in `a` and `b_end` in `b`. Compared a block at a time (in C), then bisected in the block."""
    n = min(len(a), len(b))
    start = _common(lambda i, j: a[i:j] == b[i:j], n)
    tail = _common(lambda i, j: a[len(a) - j : len(a) - i] == b[len(b) - j : len(b) - i], n - start)
    return start, len(a) - tail, len(b) - tail


def _common(same, n: int) -> int:
    """The length of the common run that `same(i, j)` (whether i..j is the same in both) finds."""
    lo = 0
    while lo < n:
        hi = min(n, lo + _BLOCK)
        if not same(lo, hi):
            break
        lo = hi
    else:
        return n
    while hi - lo > 1:  # lo..lo is the same, lo..hi not
        mid = (lo + hi) // 2
        if same(lo, mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Span:
    """A range of the source: character offsets and 0-based (line, character) ends."""

    start: int
    end: int
    start_point: tuple[int, int]
    end_point: tuple[int, int]


@dataclass(frozen=True)
class Param:
    name: str
    type_text: str  # the element type as written, without qualifiers: "float", "T", "unsigned int"
    pointer_depth: int  # 0 for scalars, 1 for `float*`
    const_pointee: bool  # `const float*`
    restrict: bool
    span: Span
    volatile_pointee: bool = False  # `volatile float*`: every access must happen as written

    @property
    def is_pointer(self) -> bool:
        return self.pointer_depth > 0

    @property
    def declared(self) -> str:
        """The parameter's type as a C programmer would read it back, e.g. `const float*`."""
        const = "const " if self.const_pointee else ""
        volatile = "volatile " if self.volatile_pointee else ""
        return f"{const}{volatile}{self.type_text}{'*' * self.pointer_depth}"


@dataclass(frozen=True)
class TemplateParam:
    name: str
    kind: str  # "type" | "value"
    type_text: str  # for value parameters: "int"; for type parameters: "typename"
    default: str | None


@dataclass(frozen=True)
class Comment:
    text: str
    span: Span


@dataclass(frozen=True)
class Kernel:
    name: str  # qualified with namespaces, e.g. "ns::scale"
    params: tuple[Param, ...]
    template_params: tuple[TemplateParam, ...]
    extern_c: bool
    span: Span  # the whole definition, `template <...>` line included
    name_span: Span
    body_span: Span
    spec_comment: Comment | None

    @property
    def short_name(self) -> str:
        return self.name.rsplit("::", 1)[-1]

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


@dataclass(frozen=True)
class LaunchSite:
    """A `kernel<<<grid, block, smem, stream>>>(args)` call in host code."""

    kernel: str
    template_args: tuple[str, ...]
    config: tuple[str, ...]  # the texts of grid, block and, where given, smem and stream
    args: tuple[str, ...]
    span: Span
    # Values of simple local variables assigned before the call in the same function, and of
    # file-level constants and macros: name -> expression text (for drafting specs).
    bindings: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Field:
    """A data member of a struct: its name, its type's text, and whether it is a plain value (not
    a pointer, an array or a bit-field)."""

    name: str
    type_text: str
    plain: bool


MAX_ALIAS_STEPS = 32  # typedefs of typedefs followed at most this deep (a cycle is not a type)

_COMMENT_PREFIX = re.compile(r"^\s*(?:/\*+|\*+/?|//+)?")


class SourceFile:
    """One parsed `.cu`/`.cuh` file. `previous`: the parse of an earlier version of it, whose tree
    tree-sitter reuses where the texts agree (a keystroke in a large file re-parses a few nodes,
    not the file)."""

    def __init__(self, text: str, path: str = "<memory>", previous: SourceFile | None = None):
        self.text = text
        self.path = path
        self._bytes = text.encode("utf-8")
        self._ascii = len(self._bytes) == len(text)
        self.tree: Tree = _parse(self._bytes, previous)
        self.kernels: list[Kernel] = []
        self.device_functions: list[str] = []
        # their definitions by (unqualified) name, for code that reads a kernel's calls
        self.device_function_nodes: dict[str, Node] = {}
        # `#define`s: name -> (parameters, or None for an object-like macro; the body's text)
        self.macros: dict[str, tuple[list[str] | None, str]] = {}
        # file-scope `const`/`constexpr` variables with a value: name -> the value's text
        self.constants: dict[str, str] = {}
        self.device_variables: list[str] = []  # writable file-scope `__device__` variables
        # `typedef float floatX;`, `using real = double;`: name -> the type's text
        self.type_aliases: dict[str, str] = {}
        # structs with a body, by name (or the typedef naming an unnamed one): their fields
        self.structs: dict[str, list[Field]] = {}
        self.main_span: Span | None = None
        self._globals: dict[str, str] = {}
        self._launch_nodes: list[Node] = []
        # each kernel's `function_definition` by the character offset of its body, found by the
        # scan: a kernel's node without another walk of the tree
        self._definitions: dict[int, Node] = {}
        self._scan(self.tree.root_node, namespace=(), extern_c=False)

    @classmethod
    def read(cls, path: str | Path) -> SourceFile:
        """The file at `path`. One that is not UTF-8 is read with U+FFFD in place of each byte
        that does not decode (that text is what is parsed and compiled), with a `SourceWarning`
        naming the first such byte."""
        return cls(read_text(path), str(Path(path)))

    # ---- positions ------------------------------------------------------------------------

    def _offset(self, byte_offset: int) -> int:
        if self._ascii:
            return byte_offset
        row = bisect.bisect_right(self._line_table[0], byte_offset) - 1
        return self._line_table[1][row] + self._chars_in(
            row, byte_offset - self._line_table[0][row]
        )

    def _point(self, point: tuple[int, int]) -> tuple[int, int]:
        row, col = point
        if self._ascii:
            return (row, col)
        return (row, self._chars_in(row, col))

    def _chars_in(self, row: int, byte_col: int) -> int:
        return len(self._lines[row][:byte_col].decode("utf-8", errors="replace"))

    @cached_property
    def _lines(self) -> list[bytes]:
        return self._bytes.split(b"\n")

    @cached_property
    def _line_table(self) -> tuple[list[int], list[int]]:
        """Byte and character offsets of each line's start (non-ASCII text only): positions of
        the thousands of nodes of a large file in one pass over it, not one pass each."""
        byte_starts, char_starts, b, c = [], [], 0, 0
        for line in self._lines:
            byte_starts.append(b)
            char_starts.append(c)
            b += len(line) + 1
            c += len(line.decode("utf-8", errors="replace")) + 1
        return byte_starts, char_starts

    def span(self, node: Node) -> Span:
        return Span(
            self._offset(node.start_byte),
            self._offset(node.end_byte),
            self._point(node.start_point),
            self._point(node.end_point),
        )

    def position(self, offset: int, end: int | None = None) -> Position:
        """The 1-based position of a character offset (and optional end offset)."""
        line, col = self.line_col(offset)
        if end is None:
            return Position(self.path, line + 1, col + 1)
        end_line, end_col = self.line_col(end)
        return Position(self.path, line + 1, col + 1, end_line + 1, end_col + 1)

    def line_col(self, offset: int) -> tuple[int, int]:
        if not 0 <= offset <= len(self.text):
            line = self.text.count("\n", 0, offset)
            return line, offset - (self.text.rfind("\n", 0, offset) + 1)
        starts = self._line_starts
        line = bisect.bisect_right(starts, offset) - 1
        return line, offset - starts[line]

    @cached_property
    def _line_starts(self) -> list[int]:
        """The character offset of each line's start: a position is a search, not a count of the
        newlines before it (a file's spec errors would each count them again)."""
        return [0, *(m.end() for m in re.finditer("\n", self.text))]

    def node_text(self, node: Node) -> str:
        return self._bytes[node.start_byte : node.end_byte].decode("utf-8", errors="replace")

    # ---- queries --------------------------------------------------------------------------

    def kernel(self, name: str) -> Kernel:
        """The kernel called `name` (plain or namespace-qualified); a clear error if there is none."""
        found = [k for k in self.kernels if name in (k.name, k.short_name)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(k.name for k in found)
            raise NoSuchKernel(f"`{name}` names several kernels ({names}): qualify it")
        known = [k.name for k in self.kernels]
        if not known:
            raise NoSuchKernel(no_kernel_message(self.path))
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean `{close[0]}`?" if close else f"kernels here: {', '.join(known)}"
        raise NoSuchKernel(f"no kernel `{name}` in {self.path}; {hint}")

    def definition(self, kernel: Kernel) -> Node | None:
        """The `function_definition` node of a kernel of this file, found by the scan (None where
        no kernel of this file has its body where `kernel`'s is)."""
        return self._definitions.get(kernel.body_span.start)

    def launch_sites(self, kernel: str | None = None) -> list[LaunchSite]:
        sites = [self._launch_site(n) for n in self._launch_nodes]
        if kernel is None:
            return sites
        short = kernel.rsplit("::", 1)[-1]
        return [s for s in sites if s.kernel.rsplit("::", 1)[-1] == short]

    def resolve_type(self, text: str) -> str:
        """The type `text` names once the file's typedefs and `using` aliases are followed:
        `floatX` -> `float` after `typedef float floatX;`; `struct P` -> `P`."""
        name = " ".join(text.split()).removeprefix("struct ").strip()
        for _ in range(MAX_ALIAS_STEPS):
            if name not in self.type_aliases:
                break
            name = self.type_aliases[name]
        return name

    def translation_unit(self) -> str:
        """The file's text with the body of `main` blanked out, line for line, so that compiler
        positions still point at the user's file and no user `main` clashes with the harness."""
        if self.main_span is None:
            return self.text
        s = self.main_span
        blanked = re.sub(r"[^\n]", " ", self.text[s.start : s.end])
        return self.text[: s.start] + blanked + self.text[s.end :]

    # ---- scanning -------------------------------------------------------------------------

    def _scan(self, node: Node, namespace: tuple[str, ...], extern_c: bool) -> None:
        """Kernels, globals and launches of the file, in the order they are written. Nested
        scopes (namespaces, `extern "C"`, preprocessor blocks) are walked with a stack of their
        children rather than by recursion: a file of thousands of nested `#ifdef`s is a file."""
        stack = [(iter(node.named_children), namespace, extern_c)]
        while stack:
            children, namespace, extern_c = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                continue
            inner = self._scan_one(child, namespace, extern_c)
            if inner is not None:
                scope, namespace, extern_c = inner
                stack.append((iter(scope.named_children), namespace, extern_c))

    def _scan_one(
        self, child: Node, namespace: tuple[str, ...], extern_c: bool
    ) -> tuple[Node, tuple[str, ...], bool] | None:
        """Take in one top-level node; a scope to walk next (node, namespace, extern "C") or None."""
        t = child.type
        if t == "function_definition":
            self._function(child, child, namespace, extern_c, ())
        elif t == "template_declaration":
            fn = next((c for c in child.named_children if c.type == "function_definition"), None)
            if fn is None:
                return child, namespace, extern_c
            self._function(fn, child, namespace, extern_c, self._template_params(child))
        elif t == "namespace_definition":
            name_node = child.child_by_field_name("name")
            ns = namespace + ((self.node_text(name_node),) if name_node else ())
            body = child.child_by_field_name("body")
            if body is not None:
                return body, ns, extern_c
        elif t == "linkage_specification":
            body = child.child_by_field_name("body")
            if body is not None and body.type == "function_definition":
                self._function(body, child, namespace, True, ())
            elif body is not None:
                return body, namespace, True
        elif t in (
            "preproc_if",
            "preproc_ifdef",
            "preproc_else",
            "preproc_elif",
            "declaration_list",
        ):
            return child, namespace, extern_c
        elif t in ("preproc_def", "preproc_function_def"):
            name, value = child.child_by_field_name("name"), child.child_by_field_name("value")
            if name is not None and value is not None:
                text = self.node_text(value).strip()
                params = None
                if t == "preproc_function_def":
                    plist = child.child_by_field_name("parameters")
                    params = [self.node_text(c) for c in plist.named_children] if plist else []
                else:
                    self._globals[self.node_text(name)] = text
                self.macros[self.node_text(name)] = (params, text)
        elif t in ("type_definition", "alias_declaration", "struct_specifier"):
            self._type_declaration(child)
        elif t == "declaration":
            if (spec := child.child_by_field_name("type")) is not None:
                self._type_declaration(spec)
            bindings = self._bindings_of(child)
            self._globals.update(bindings)
            qualifiers = {self.node_text(c) for c in child.children if c.type == "type_qualifier"}
            if qualifiers & {"const", "constexpr"}:
                self.constants.update(bindings)
            self.device_variables.extend(_device_variables(self, child, namespace))
        return None

    def _type_declaration(self, node: Node) -> None:
        """Record a typedef, a `using` alias or a struct's fields."""
        if node.type == "struct_specifier":
            name, body = node.child_by_field_name("name"), node.child_by_field_name("body")
            if name is not None and body is not None:
                self.structs[self.node_text(name)] = self._fields(body)
            return
        type_node = node.child_by_field_name("type")
        if type_node is None:
            return
        if node.type == "alias_declaration":
            name = node.child_by_field_name("name")
            if name is not None:
                self.type_aliases[self.node_text(name)] = " ".join(
                    self.node_text(type_node).split()
                )
            return
        body = (
            type_node.child_by_field_name("body") if type_node.type == "struct_specifier" else None
        )
        if type_node.type == "struct_specifier":
            self._type_declaration(type_node)
        for d in node.children_by_field_name("declarator"):
            if d.type != "type_identifier":
                continue  # a pointer or array typedef names no element type
            alias = self.node_text(d)
            tag = (
                type_node.child_by_field_name("name")
                if type_node.type == "struct_specifier"
                else None
            )
            if body is not None and tag is None:
                self.structs[alias] = self._fields(body)
            else:
                aliased = self.node_text(tag) if tag is not None else self.node_text(type_node)
                self.type_aliases[alias] = " ".join(aliased.split())

    def _fields(self, body: Node) -> list[Field]:
        out = []
        for f in body.named_children:
            if f.type != "field_declaration":
                continue
            type_node = f.child_by_field_name("type")
            type_text = " ".join(self.node_text(type_node).split()) if type_node else ""
            bitfield = any(c.type == "bitfield_clause" for c in f.named_children)
            for d in f.children_by_field_name("declarator"):
                plain = d.type == "field_identifier" and not bitfield
                while d.type != "field_identifier" and d.child_by_field_name("declarator"):
                    d = d.child_by_field_name("declarator")
                out.append(Field(self.node_text(d), type_text, plain))
        return out

    def _function(
        self,
        fn: Node,
        outer: Node,
        namespace: tuple[str, ...],
        extern_c: bool,
        template_params: tuple[TemplateParam, ...],
    ) -> None:
        qualifiers = {c.type for c in fn.children if not c.is_named}
        declarator = fn.child_by_field_name("declarator")
        while declarator is not None and declarator.type != "function_declarator":
            declarator = declarator.child_by_field_name("declarator")
        if declarator is None:
            return
        name_node = declarator.child_by_field_name("declarator")
        name = self.node_text(name_node) if name_node is not None else ""
        body = fn.child_by_field_name("body")
        if body is not None:
            self._collect_launches(body)
        if "__global__" not in qualifiers:
            if "__device__" in qualifiers:
                self.device_functions.append(name)
                self.device_function_nodes[name] = fn
            elif name == "main" and not namespace:
                self.main_span = self.span(outer)
            return
        params = tuple(
            self._param(p, i)
            for i, p in enumerate(declarator.child_by_field_name("parameters").named_children)
            if p.type == "parameter_declaration"
        )
        kernel = Kernel(
            name="::".join(namespace + (name,)),
            params=params,
            template_params=template_params,
            extern_c=extern_c,
            span=self.span(outer),
            name_span=self.span(name_node),
            body_span=self.span(body) if body is not None else self.span(fn),
            spec_comment=self._spec_comment(outer),
        )
        self.kernels.append(kernel)
        if body is not None:
            self._definitions.setdefault(kernel.body_span.start, fn)

    def _param(self, decl: Node, index: int) -> Param:
        type_node = decl.child_by_field_name("type")
        qualifiers = {self.node_text(c) for c in decl.named_children if c.type == "type_qualifier"}
        const, volatile = "const" in qualifiers, "volatile" in qualifiers
        depth, restrict, name = 0, False, f"arg{index}"
        d = decl.child_by_field_name("declarator")
        while d is not None:
            if d.type == "pointer_declarator":
                depth += 1
                restrict |= any(
                    c.type == "type_qualifier" and "restrict" in self.node_text(c)
                    for c in d.named_children
                )
            elif d.type == "identifier":
                name = self.node_text(d)
                break
            d = d.child_by_field_name("declarator")
        type_text = " ".join(self.node_text(type_node).split()) if type_node is not None else "int"
        return Param(
            name, type_text, depth, const, restrict, self.span(decl), volatile and depth > 0
        )

    def _template_params(self, tdecl: Node) -> tuple[TemplateParam, ...]:
        plist = tdecl.child_by_field_name("parameters")
        out: list[TemplateParam] = []
        for p in plist.named_children if plist is not None else []:
            default = p.child_by_field_name("default_type") or p.child_by_field_name(
                "default_value"
            )
            default_text = self.node_text(default) if default is not None else None
            if p.type in ("type_parameter_declaration", "optional_type_parameter_declaration"):
                ident = next((c for c in p.named_children if c.type == "type_identifier"), None)
                name = p.child_by_field_name("name") or ident
                out.append(TemplateParam(self.node_text(name), "type", "typename", default_text))
            elif p.type in ("parameter_declaration", "optional_parameter_declaration"):
                decl = p.child_by_field_name("declarator")
                type_node = p.child_by_field_name("type")
                out.append(
                    TemplateParam(
                        self.node_text(decl) if decl is not None else "",
                        "value",
                        self.node_text(type_node) if type_node is not None else "int",
                        default_text,
                    )
                )
        return tuple(out)

    def _spec_comment(self, outer: Node) -> Comment | None:
        """The `@optiml` comment right above a definition: a block comment or a run of `//` lines,
        with only blank lines between it and the definition."""
        prev = outer.prev_sibling
        if (
            prev is None
            or prev.type != "comment"
            or self._has_code_between(prev.end_byte, outer.start_byte)
        ):
            return None
        nodes = [prev]
        if not self.node_text(prev).startswith("/*"):
            while (
                (p := nodes[0].prev_sibling) is not None
                and p.type == "comment"
                and self.node_text(p).startswith("//")
                and p.end_point[0] == nodes[0].start_point[0] - 1
            ):
                nodes.insert(0, p)
        first, last = nodes[0], nodes[-1]
        span = Span(
            self._offset(first.start_byte),
            self._offset(last.end_byte),
            self._point(first.start_point),
            self._point(last.end_point),
        )
        text = self.text[span.start : span.end]
        return Comment(text, span) if "@optiml" in text else None

    def _has_code_between(self, start_byte: int, end_byte: int) -> bool:
        return bool(self._bytes[start_byte:end_byte].strip())

    # ---- launch sites ---------------------------------------------------------------------

    def _collect_launches(self, node: Node) -> None:
        """The `<<<...>>>` calls under `node`, in the order they appear (one query in C, not a
        walk of every node in Python: the body of each of a file's functions is searched)."""
        found = QueryCursor(_LAUNCHES).captures(node).get("launch", [])
        self._launch_nodes.extend(sorted(found, key=lambda n: (n.start_byte, -n.end_byte)))

    def _launch_site(self, call: Node) -> LaunchSite:
        fn = call.child_by_field_name("function")
        template_args: tuple[str, ...] = ()
        name = self.node_text(fn) if fn is not None else ""
        # `k<float>` or `ns::k<float>`: the template arguments are not part of the name.
        tf = fn
        while tf is not None and tf.type == "qualified_identifier":
            tf = tf.child_by_field_name("name")
        if tf is not None and tf.type == "template_function":
            targs = tf.child_by_field_name("arguments")
            template_args = tuple(self.node_text(a) for a in targs.named_children) if targs else ()
            name = name[: len(name) - len(self.node_text(tf))] + self.node_text(
                tf.child_by_field_name("name")
            )
        config_node = next(c for c in call.named_children if c.type == "kernel_call_syntax")
        args_node = call.child_by_field_name("arguments")
        bindings = dict(self._globals)
        enclosing = call.parent
        while enclosing is not None and enclosing.type != "function_definition":
            enclosing = enclosing.parent
        if enclosing is not None:
            bindings.update(self._local_bindings(enclosing, call.start_byte))
        return LaunchSite(
            kernel=name,
            template_args=template_args,
            config=tuple(self.node_text(c) for c in config_node.named_children),
            args=tuple(self.node_text(a) for a in args_node.named_children) if args_node else (),
            span=self.span(call),
            bindings=bindings,
        )

    def _local_bindings(self, fn: Node, before_byte: int) -> dict[str, str]:
        out: dict[str, str] = {}
        stack = [fn.child_by_field_name("body")]
        found: list[Node] = []
        while stack:
            n = stack.pop()
            if n is None or n.start_byte >= before_byte:
                continue
            if n.type in ("declaration", "assignment_expression"):
                found.append(n)
            stack.extend(n.named_children)
        for n in sorted(found, key=lambda n: n.start_byte):
            if n.type == "declaration":
                out.update(self._bindings_of(n))
            else:
                left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
                if left is not None and right is not None and left.type == "identifier":
                    out[self.node_text(left)] = self.node_text(right)
        return out

    def _bindings_of(self, decl: Node) -> dict[str, str]:
        """`int n = 1 << 20;`, `dim3 block(32, 8);`, `dim3 grid = dim3(a, b);` as name -> text."""
        out: dict[str, str] = {}
        for d in decl.children_by_field_name("declarator"):
            if d.type != "init_declarator":
                continue
            name, value = d.child_by_field_name("declarator"), d.child_by_field_name("value")
            if name is None or value is None or name.type != "identifier":
                continue
            text = self.node_text(value)  # `dim3 block(32, 8)` keeps its parenthesized tuple
            if value.type == "call_expression":
                f = value.child_by_field_name("function")
                if f is not None and self.node_text(f) == "dim3":
                    text = self.node_text(value.child_by_field_name("arguments"))
            elif value.type == "initializer_list":
                text = "(" + self.node_text(value)[1:-1] + ")"
            out[self.node_text(name)] = text
        return out


def comment_body_lines(comment: Comment) -> list[tuple[int, str]]:
    """The lines of a comment with the comment markers blanked out, as (character offset of the
    line's start in the file, text). Blanking instead of cutting keeps every column true."""
    out = []
    offset = comment.span.start
    for raw in comment.text.split("\n"):
        m = _COMMENT_PREFIX.match(raw)
        kept = " " * m.end() + raw[m.end() :]
        stripped = kept.rstrip()
        if stripped.endswith("*/"):
            kept = stripped[:-2]
        out.append((offset, kept))
        offset += len(raw) + 1
    return out


def _device_variables(src: SourceFile, decl: Node, namespace: tuple[str, ...]) -> list[str]:
    """The qualified names a file-scope declaration gives to writable `__device__` variables
    (not `__constant__`, `const` or `constexpr`, not functions): state a kernel can leave behind
    for its next launch."""
    kinds = {c.type for c in decl.children}
    if "__device__" not in kinds:
        return []
    parent = decl.parent
    while parent is not None:  # variable templates, and what a preprocessor condition may drop
        if parent.type == "template_declaration" or parent.type.startswith("preproc_"):
            return []
        parent = parent.parent
    words = {
        src.node_text(c)
        for c in decl.children
        if c.type in ("type_qualifier", "storage_class_specifier")
    }
    if words & {"const", "constexpr", "__constant__", "extern"}:
        return []
    names = []
    for d in decl.children_by_field_name("declarator"):
        while d.type in ("init_declarator", "array_declarator", "attributed_declarator"):
            inner = d.child_by_field_name("declarator")
            if inner is None:
                break
            d = inner
        if d.type == "identifier":
            names.append("::".join((*namespace, src.node_text(d))))
    return names


def read_text(path: str | Path) -> str:
    """The text of the file at `path`, as `SourceFile.read` takes it (what a remote job sends)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputFileError(f"no such file: {p}") from None
    except IsADirectoryError:
        raise InputFileError(f"{p} is a directory, not a .cu file") from None
    except (OSError, ValueError) as e:
        raise InputFileError(f"cannot read {p}: {getattr(e, 'strerror', None) or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", errors="replace")
        warnings.warn(
            f"{p} is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start} does not "
            "decode): read with U+FFFD in place of each such byte",
            SourceWarning,
            stacklevel=3,
        )
    return text
