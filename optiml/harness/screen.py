"""A static screen of a candidate file against the original, on the tree, before anything is compiled.

A candidate is the user's file with device code rewritten. It is compiled together with the launcher
into a shared object that the runner loads into its own process, so host code in it would run with
the runner's rights: reading expected outputs, forging the result file, moving the timed work to
another stream, slowing the reference down, behaving differently under a sanitizer. The screen lets
through only what may differ: device functions (`__global__`, `__device__`, and `__host__
__device__` ones that reach no host capability), device-side data, constants, types whose member
functions are device functions, CUDA device and math headers, macros with names nothing else uses.
Everything the host compiles into code — host functions, host data, other includes, file-scope
pragmas, using-directives, `extern` declarations — must be the original's, token for token
(whitespace and comments aside) and in the original's order; leaving some of it out is allowed.

The screen trusts the tree only where the compiler reads the file the same way, and refuses what
the two could read differently: parse errors outside a device function's body, digraphs, line
continuations outside directives, lone carriage returns, macros with unbalanced brackets or named
like what host code or the launcher uses, macros standing for qualifiers.

The screen reads each file once (`_Index`, kept while the SourceFile lives), so screening many
candidates of one original costs a walk of each candidate's tree.
"""

from __future__ import annotations

import bisect
import re
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import cache, lru_cache

from pydantic import BaseModel
from tree_sitter import Node

from optiml.cuda.source import SourceFile
from optiml.harness.build import LAUNCHER_FILE, launcher_source


class Finding(BaseModel):
    """One thing in a candidate that the screen does not allow: where it is and why."""

    line: int  # 1-based, in the candidate file
    column: int  # 1-based
    message: str


def screen(original: SourceFile, candidate: SourceFile, kernel: str) -> list[Finding]:
    """Empty when the candidate differs from the original only in what may differ."""
    return _Screen(original, candidate, kernel).run()


# ---- what is allowed, what is reserved ------------------------------------------------------------

# Headers of device code and of compile-time maths; nvcc includes `cuda_runtime.h` and
# `device_launch_parameters.h` in every file anyway.
DEVICE_HEADERS = frozenset(
    {
        "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cooperative_groups.h", "mma.h",
        "cuda_pipeline.h", "cuda_pipeline_primitives.h", "cuda/pipeline", "cuda/barrier",
        "cuda/ptx", "math_constants.h", "cuda_runtime.h", "device_launch_parameters.h",
        "math.h", "cmath", "cfloat", "float.h", "climits", "limits.h", "cstdint", "stdint.h",
        "cstddef", "stddef.h", "type_traits", "limits", "utility",
    }
)  # fmt: skip
DEVICE_HEADER_PREFIXES = ("cooperative_groups/", "cuda/std/", "cub/", "cuda_awbarrier")

# What host-compiled code of a candidate may not reach: files, processes, the environment, dynamic
# loading, memory mappings, exit handlers, threads.
HOST_CAPABILITIES = frozenset(
    {
        "fopen", "fdopen", "freopen", "fclose", "open", "openat", "creat", "close", "read",
        "write", "pread", "pwrite", "readv", "writev", "fread", "fwrite", "fprintf", "vfprintf",
        "fputs", "fputc", "putc", "fgets", "fgetc", "getc", "fscanf", "fseek", "ftell", "rewind",
        "fflush", "remove", "rename", "unlink", "truncate", "ftruncate", "tmpfile", "mkstemp",
        "opendir", "readdir", "stat", "lstat", "fstat", "access", "chdir", "chmod", "filesystem",
        "system", "popen", "pclose", "fork", "vfork", "clone", "execl", "execle", "execlp",
        "execv", "execve", "execvp", "execvpe", "posix_spawn", "posix_spawnp", "kill", "raise",
        "signal", "sigaction", "alarm", "wait", "waitpid", "getpid", "getppid",
        "getenv", "secure_getenv", "setenv", "putenv", "unsetenv", "clearenv", "environ",
        "dlopen", "dlsym", "dlvsym", "dlclose", "dladdr", "dlinfo",
        "mmap", "munmap", "mprotect", "mremap", "ptrace", "syscall", "ioctl", "prctl",
        "socket", "connect", "bind", "listen", "accept", "send", "recv",
        "atexit", "at_quick_exit", "on_exit", "exit", "_exit", "_Exit", "quick_exit", "abort",
        "longjmp", "setjmp", "sleep", "usleep", "nanosleep",
        "ifstream", "ofstream", "fstream", "filebuf", "basic_ifstream", "basic_ofstream",
        "basic_fstream", "thread", "jthread", "async", "FILE",
    }
)  # fmt: skip
HOST_CAPABILITY_PREFIXES = ("pthread_",)

# Attributes device code uses. Others (constructor, destructor, section, init_priority, alias,
# ifunc, weakref, cleanup, visibility, ...) change what runs at load time or which symbol is which.
ALLOWED_ATTRIBUTES = frozenset(
    {
        "aligned", "__aligned__", "packed", "__packed__", "noinline", "__noinline__",
        "always_inline", "__always_inline__", "unused", "__unused__", "maybe_unused", "nodiscard",
        "deprecated", "noreturn", "__noreturn__", "likely", "unlikely", "fallthrough",
        "may_alias", "__may_alias__", "const", "__const__", "pure", "__pure__", "flatten",
        "hot", "cold", "assume", "no_unique_address",
        # CUDA's launch attributes: the shape of a cluster, a block's bounds, a register cap
        "cluster_dims", "__cluster_dims__", "launch_bounds", "__launch_bounds__", "maxnreg",
        "__maxnreg__",
    }
)  # fmt: skip
# The ones a macro may not hold (its text is not a tree, so it is read for these words).
LOAD_ATTRIBUTES = frozenset(
    {"constructor", "destructor", "section", "init_priority", "alias", "ifunc", "weakref",
     "cleanup", "visibility", "used", "retain", "weak"}
)  # fmt: skip

# Pragmas a function body may hold (not push_macro/pop_macro, redefine_extname, GCC ...).
BODY_PRAGMAS = frozenset({"unroll", "nounroll"})
# Namespaces a using-directive may open at file scope: device libraries, which declare nothing the
# launcher or host code calls.
DEVICE_NAMESPACES = frozenset({"nvcuda", "cooperative_groups", "cub", "cuda"})

# C and C++ keywords: no macro may take one (CUDA's qualifiers fall under the `__` prefix).
KEYWORDS = frozenset(
    {
        "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break",
        "case", "catch", "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept",
        "const", "consteval", "constexpr", "constinit", "const_cast", "continue", "co_await",
        "co_return", "co_yield", "decltype", "default", "defined", "delete", "do", "double",
        "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for",
        "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new",
        "noexcept", "not", "not_eq", "nullptr", "operator", "or", "or_eq", "private",
        "protected", "public", "register", "reinterpret_cast", "requires", "restrict", "return",
        "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct",
        "switch", "template", "this", "thread_local", "throw", "true", "try", "typedef",
        "typeid", "typename", "union", "unsigned", "using", "virtual", "void", "volatile",
        "wchar_t", "while", "xor", "xor_eq",
    }
)  # fmt: skip
# Names of the C library and the launcher's world that no macro, host-compiled function or host
# value of a candidate may take.
RESERVED_NAMES = (
    frozenset({"dim3", "main", "size_t", "std", "malloc", "calloc", "realloc", "free", "printf",
               "puts", "memcpy", "memset"})
    | HOST_CAPABILITIES
)  # fmt: skip
# No declaration at all may take: cuda*, CUDA*, cu + capital (the driver API), nv + capital and
# NV_ (NVTX, NVML, libcu++'s NV_IF_TARGET), `__` and `_` + capital (the implementation's:
# __device__, __launch_bounds__, _Pragma), and the build's `optiml_ref_N` functions.
_RESERVED_PREFIX = re.compile(r"^(?:cuda|CUDA|cu[A-Z]|nv[A-Z]|NV_|__|_[A-Z]|optiml_ref_)")
# The launcher's prefix: the catalog's device functions, types and namespaces use it
# (optiml_sgemm, optiml_pack, optiml_warp_softmax); macros and host-compiled names may not, except
# an include guard (`#ifndef OPTIML_X` / `#define OPTIML_X`).
_LAUNCHER_PREFIX = re.compile(r"^(?:optiml_|OPTIML_)")
# A CUDA runtime or driver API name in device code: only the device runtime (relocatable device
# code, which candidates are not built with) has any; `__cuda*` are the runtime's internals.
_RUNTIME_NAME = re.compile(r"^(?:cuda[A-Z]|cu[A-Z]|__cuda)")
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
_SPACES = ("__global__", "__device__", "__host__")
# A function with one of these is compiled for the device (with `__host__`, for the host too);
# without, it is host code (`__host__` alone included).
_DEVICE_SPACES = frozenset({"__global__", "__device__"})
_DEVICE_DATA = frozenset({"__device__", "__constant__", "__shared__"})
# Types of a const value whose initialization is a constant (no constructor runs).
SCALAR_TYPES = frozenset(
    {"size_t", "ptrdiff_t", "intptr_t", "uintptr_t", "int8_t", "int16_t", "int32_t", "int64_t",
     "uint8_t", "uint16_t", "uint32_t", "uint64_t", "auto"}
)  # fmt: skip
# CUDA attribute macros tree-sitter-cuda does not know: `__global__ void __cluster_dims__(2, 1, 1)
# k(...)` parses as a declaration of `__cluster_dims__` (ended by a missing `;`) and a definition
# without qualifiers.
_SPLIT_ATTRIBUTES = frozenset({"__cluster_dims__", "__maxnreg__", "__block_size__"})
_CONDITIONALS = ("preproc_if", "preproc_ifdef", "preproc_elif", "preproc_else", "preproc_elifdef")
_TYPES = ("struct_specifier", "class_specifier", "union_specifier")
_MACROS = ("preproc_def", "preproc_function_def")
_DIRECTIVES = (*_MACROS, "preproc_call", "preproc_include", "preproc_defined")
_LITERALS = ("comment", "string_literal", "raw_string_literal", "char_literal", "system_lib_string")
# Items not compared as host code: compile-time declarations and macros (screened by what they
# are), and file-scope statements and parse errors (refused by themselves where they are new).
_COMPILE_TIME = (
    *_MACROS,
    *_TYPES,
    "enum_specifier",
    "type_definition",
    "alias_declaration",
    "namespace_alias_definition",
    "static_assert_declaration",
    "concept_definition",
    "expression_statement",
    "ERROR",
)
# Parts of a constant initializer (besides identifiers, calls, which are looked at).
_CONSTANT_PARTS = frozenset(
    {
        "number_literal", "char_literal", "string_literal", "concatenated_string",
        "string_content", "escape_sequence", "raw_string_literal", "true", "false", "null",
        "nullptr", "binary_expression", "unary_expression", "conditional_expression",
        "parenthesized_expression", "cast_expression", "type_descriptor", "primitive_type",
        "sized_type_specifier", "type_qualifier", "abstract_pointer_declarator",
        "sizeof_expression", "alignof_expression", "initializer_list", "initializer_pair",
        "field_designator", "subscript_designator", "field_identifier", "qualified_identifier",
        "namespace_identifier", "type_identifier", "comment", "argument_list",
    }
)  # fmt: skip


def walk(node: Node) -> Iterator[Node]:
    """Every node under `node`, itself first, in source order (by a cursor: a third of the time
    of a walk by lists of children, and the screen walks every candidate)."""
    cursor = node.walk()
    while True:
        yield cursor.node
        if cursor.goto_first_child():
            continue
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return


def _is_capability(name: str) -> bool:
    return name in HOST_CAPABILITIES or name.startswith(HOST_CAPABILITY_PREFIXES)


@cache
def _launcher_names() -> tuple[frozenset[str], frozenset[str]]:
    """The launcher's words, read off its own tree: every identifier and keyword in it (a macro
    named like one would rewrite the launcher) and the names it refers to rather than declares (a
    declaration named like one could be picked by its unqualified calls)."""
    probe = SourceFile("__global__ void optiml_probe() {}\n")
    text = launcher_source(probe, probe.kernels[0], "")
    launcher = SourceFile(text.split(f'#line 1 "{LAUNCHER_FILE}"', 1)[1])
    words, declared, used = set(), set(), set()
    for n in walk(launcher.tree.root_node):
        word = launcher.node_text(n)
        if n.type == "preproc_arg":
            words.update(_fragment_tokens(word))
        elif n.child_count == 0:
            words.add(word)
        if n.type in ("identifier", "type_identifier", "primitive_type"):
            (declared if _declares(n) else used).add(word)
    words = {w for w in words if _IDENTIFIER.match(w)}
    used -= declared | KEYWORDS | {"optiml_probe"}
    return frozenset(words - {"optiml_probe"}), frozenset(used)


def _declares(n: Node) -> bool:
    """Whether identifier `n` is the name a parameter or a local variable declares."""
    p = n.parent
    while p is not None and p.type in ("pointer_declarator", "reference_declarator"):
        p = p.parent
    return p is not None and (
        p.type in ("parameter_declaration", "init_declarator")
        or (p.type == "declaration" and p.child_by_field_name("type") != n)
    )


@lru_cache(maxsize=4096)
def _fragment(text: str) -> SourceFile:
    """A piece of code parsed alone: a macro's text."""
    return SourceFile(text)


def _fragment_tokens(text: str) -> tuple[str, ...]:
    """The tokens of a macro's replacement text, by tree-sitter's lexer (a string stays whole)."""
    sf = _fragment(text)
    return tuple(
        sf.node_text(n)
        for n in walk(sf.tree.root_node)
        if (n.child_count == 0 or n.type in ("string_literal", "char_literal"))
        and n.type != "comment"
        and n.start_byte != n.end_byte
        and (n.parent is None or n.parent.type not in ("string_literal", "char_literal"))
    )


# ---- the file as a list of items ------------------------------------------------------------------


@dataclass(frozen=True)
class _Item:
    """One thing at file scope (or in a namespace, an `extern "C"` block or a branch of `#if`):
    one node, or a declaration and the definition tree-sitter split it from (`_SPLIT_ATTRIBUTES`)."""

    nodes: tuple[Node, ...]
    scope: tuple[str, ...]  # enclosing namespaces and linkage blocks
    guards: frozenset[str] = frozenset()  # the words of the enclosing `#if`s' conditions

    @property
    def node(self) -> Node:
        """The declaration itself, out of its `template <...>`."""
        return _unwrap(self.nodes[-1])

    @property
    def first(self) -> Node:
        return self.nodes[0]

    @property
    def space(self) -> frozenset[str]:
        """Where a function lives; a split definition has it on the declaration before it."""
        return _space(_unwrap(self.nodes[0]))


def _items(
    sf: SourceFile, node: Node, scope: tuple[str, ...] = (), guards: frozenset[str] = frozenset()
) -> Iterator[_Item]:
    """The items of a translation unit or a container, containers opened, in source order."""
    children = [c for c in _contents(node) if c.type != "comment"]
    i = 0
    while i < len(children):
        c = children[i]
        body = c.child_by_field_name("body")
        if c.type in _CONDITIONALS or c.type == "declaration_list":
            yield from _items(sf, c, scope, guards | _condition_words(sf, c))
        elif c.type == "namespace_definition" and body is not None:
            name = c.child_by_field_name("name")
            inner = (*scope, sf.node_text(name) if name else "(anonymous)")
            yield from _items(sf, body, inner, guards)
        elif c.type == "linkage_specification" and body is not None:
            value = c.child_by_field_name("value")
            inner = (*scope, f"extern {sf.node_text(value) if value else ''}")
            if body.type == "declaration_list":
                yield from _items(sf, body, inner, guards)
            else:
                yield _Item((body,), inner, guards)
        elif i + 1 < len(children) and _split_attribute(sf, c, children[i + 1]):
            yield _Item((c, children[i + 1]), scope, guards)
            i += 1
        else:
            yield _Item((c,), scope, guards)
        i += 1


def _condition_words(sf: SourceFile, node: Node) -> frozenset[str]:
    """The macro names an `#if`, `#ifdef` or `#elif` tests: defining one can switch the code
    under it on."""
    words = frozenset()
    for f in ("condition", "name"):
        part = node.child_by_field_name(f) if node.type in _CONDITIONALS else None
        if part is not None:
            words |= {sf.node_text(n) for n in walk(part) if n.type == "identifier"}
    return words


def _contents(node: Node) -> list[Node]:
    """A container's named children, without a conditional's condition or macro name."""
    skip = {
        n.id
        for f in ("condition", "name")
        if node.type in _CONDITIONALS and (n := node.child_by_field_name(f)) is not None
    }
    return [c for c in node.named_children if c.id not in skip]


def _split_attribute(sf: SourceFile, decl: Node, nxt: Node) -> bool:
    """Whether `decl` is `__global__ void __cluster_dims__(...)` (ended by a missing `;`) and
    `nxt` the definition it belongs to, right after it."""
    inner = _unwrap(decl)
    if inner.type != "declaration" or nxt.type != "function_definition" or _space(nxt):
        return False
    last = inner.children[-1] if inner.children else None
    init = inner.child_by_field_name("declarator")
    name = init.child_by_field_name("declarator") if init is not None else None
    return (
        last is not None
        and last.is_missing
        and name is not None
        and sf.node_text(name) in _SPLIT_ATTRIBUTES
        and not sf._bytes[last.end_byte : nxt.start_byte].strip()
    )


def _unwrap(node: Node) -> Node:
    """The declaration inside `template <...>` (and templates of templates)."""
    while node.type == "template_declaration":
        inner = [
            c for c in node.named_children if c.type not in ("template_parameter_list", "comment")
        ]
        if not inner:
            break
        node = inner[-1]
    return node


def _space(node: Node) -> frozenset[str]:
    """`__global__`, `__device__`, `__host__` among a definition's or declaration's own words
    (not inside a branch of `#if`, not in a macro: the tree does not expand macros)."""
    return frozenset(c.type for c in node.children if c.type in _SPACES)


def _qualifiers(node: Node) -> frozenset[str]:
    """Every specifier word of a declaration: storage classes, CUDA memory spaces, cv."""
    out = {c.type for c in node.children if not c.is_named}
    for c in node.children:
        if c.type in ("type_qualifier", "storage_class_specifier"):
            out.update(g.type for g in c.children)
    return frozenset(out)


def _function_declarator(node: Node) -> Node | None:
    """The function declarator of a declaration that declares a function (not a pointer to one)."""
    d = node.child_by_field_name("declarator")
    while d is not None and d.type in ("pointer_declarator", "reference_declarator"):
        d = d.child_by_field_name("declarator")
    if d is None or d.type != "function_declarator":
        return None
    inner = d.child_by_field_name("declarator")
    return None if inner is None or inner.type == "parenthesized_declarator" else d


def _declared(node: Node) -> Node | None:
    """The name node of what a function definition or a declaration declares (the first one)."""
    fd = _function_declarator(node)
    if fd is not None:
        return fd.child_by_field_name("declarator")
    d = node.child_by_field_name("declarator")
    while d is not None and d.child_by_field_name("declarator") is not None:
        d = d.child_by_field_name("declarator")
    return d


# Lexical hazards: what the compiler reads otherwise than tree-sitter. A backslash-newline joins two
# lines into one token (`sys\\` + `tem(...)` calls `system`); a digraph is a bracket or a `#` to the
# compiler (`%> void f() <%` ends a device function and starts a host one; `%:define` is `#define`);
# a carriage return without a line feed ends a line, and a `//` comment, to the compiler; a NUL is
# dropped by one compiler and ends the text for another. `<::` not followed by `:` or `>` is `<`
# `::`, not a digraph. (Checked with nvcc 13.0.)
_HAZARD = re.compile(rb"\\\r?\n|<%|%>|<:(?!:[^:>])|:>|%:|\r(?!\n)|\x00")
DIGRAPHS = {"<%": "{", "%>": "}", "<:": "[", ":>": "]", "%:": "#"}
_SPLICES = ("\\\n", "\\\r\n")


def _hazards(sf: SourceFile) -> Iterator[tuple[int, str]]:
    """The file's lexical hazards: line continuations outside directives, comments and literals;
    digraphs outside comments and literals; lone carriage returns and NULs anywhere. As (byte
    offset, the characters)."""
    root = sf.tree.root_node
    for m in _HAZARD.finditer(sf._bytes):
        at, chars = m.start(), m.group().decode()
        inner = root.descendant_for_byte_range(at, at + 1)
        p = inner if chars in DIGRAPHS or chars in _SPLICES else None
        while p is not None and p.type != "translation_unit":
            if p.type in _LITERALS:
                break
            if chars in _SPLICES:
                if p.type in _DIRECTIVES:
                    break
                condition = p.child_by_field_name("condition") if p.type in _CONDITIONALS else None
                if condition is not None and at < condition.end_byte:
                    break
            p = p.parent
        if p is None or p.type == "translation_unit":
            yield at, chars


def _brackets_balanced(tokens: Iterable[str]) -> bool:
    """Whether (), [] and {} nest: a macro with an unbalanced one could end a function where the
    tree sees it go on."""
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for t in tokens:
        if t in ("(", "[", "{"):
            stack.append(t)
        elif t in pairs and (not stack or stack.pop() != pairs[t]):
            return False
    return not stack


# ---- what the screen reads off one file ----------------------------------------------------------


class _Index:
    """What the screen reads off one file, in one walk of its tree: its items and their tokens,
    which of them are host code, its macros, includes, namespaces and type names."""

    def __init__(self, sf: SourceFile):
        self._sf = weakref.ref(sf)  # not the file itself: the cache of indexes is keyed by it
        self.starts: list[int] = []  # the byte offset of each token
        self.texts: list[str] = []  # and its text
        self.macro_nodes: list[Node] = []
        self.macro_defs: dict[str, tuple[str | None, str]] = {}  # name -> (params, text)
        self.include_nodes: list[Node] = []
        self.namespace_nodes: list[Node] = []
        self.enums: set[str] = set()
        self.classes: set[str] = set()  # structs, classes, unions and enums defined here
        self.device_fns: set[str] = set()
        aliases: list[tuple[set[str], set[str]]] = []
        for n in walk(sf.tree.root_node):
            t = n.type
            if n.child_count == 0:
                if t != "comment" and n.start_byte != n.end_byte:
                    text = sf.node_text(n)
                    self.starts.append(n.start_byte)
                    self.texts.append(" ".join(text.split()) if t == "preproc_arg" else text)
            elif t in _MACROS:
                self._macro(n)
            elif t == "preproc_include":
                self.include_nodes.append(n)
            elif t == "namespace_definition" and n.child_by_field_name("name") is not None:
                self.namespace_nodes.append(n)
            elif t in (*_TYPES, "enum_specifier") and (name := n.child_by_field_name("name")):
                if t == "enum_specifier":
                    self.enums.add(sf.node_text(name))
                if n.child_by_field_name("body") is not None:
                    self.classes.add(sf.node_text(name))
            elif t == "function_definition" and _space(n) & _DEVICE_SPACES:
                if (d := _declared(n)) is not None:
                    self.device_fns.add(sf.node_text(d).split("<")[0])
            elif t in ("type_definition", "alias_declaration"):
                names = n.children_by_field_name("declarator") or [n.child_by_field_name("name")]
                own = {sf.node_text(d) for d in names if d is not None}
                words = {sf.node_text(x) for x in walk(n) if x.child_count == 0}
                aliases.append((own, words - own))
        self.macro_keys = {self.tokens((n,)) for n in self.macro_nodes}
        self.include_keys = {self.tokens((n,)) for n in self.include_nodes}
        self.namespaces = {
            sf.node_text(n.child_by_field_name("name")) for n in self.namespace_nodes
        }
        # name -> the tokens of its text
        self.macros = {name: _fragment_tokens(text) for name, (_, text) in self.macro_defs.items()}
        self.unbalanced = {
            name for name, body in self.macros.items() if not _brackets_balanced(body)
        }
        self.tainted = _tainted(aliases)
        self.items = list(_items(sf, sf.tree.root_node))
        self.keys = [(it.scope, self.tokens(it.nodes)) for it in self.items]
        self.host = [_is_host(self, it) for it in self.items]
        # Lexical hazards (`_HAZARD`), placed by the two tokens on either side: one the original
        # has in the same place is the original's.
        self.hazards: dict[tuple, int] = {}  # -> the byte offset of the first
        for at, chars in _hazards(sf):
            i = bisect.bisect_left(self.starts, at)
            around = (tuple(self.texts[max(i - 2, 0) : i]), tuple(self.texts[i : i + 2]))
            self.hazards.setdefault((chars, around), at)

    @property
    def sf(self) -> SourceFile:
        sf = self._sf()
        assert sf is not None, "a file's index outlived the file"
        return sf

    def _macro(self, n: Node) -> None:
        self.macro_nodes.append(n)
        params, value = n.child_by_field_name("parameters"), n.child_by_field_name("value")
        self.macro_defs[self.sf.node_text(n.child_by_field_name("name"))] = (
            self.sf.node_text(params) if params is not None else None,
            self.sf.node_text(value) if value is not None else "",
        )

    def tokens(self, nodes: Iterable[Node]) -> tuple[str, ...]:
        """The tokens of some nodes, comments left out, a directive's argument with its spacing
        normalized: what two items are compared by."""
        out: list[str] = []
        for node in nodes:
            lo = bisect.bisect_left(self.starts, node.start_byte)
            hi = bisect.bisect_left(self.starts, node.end_byte)
            out.extend(self.texts[lo:hi])
        return tuple(out)


_INDEXES: weakref.WeakKeyDictionary[SourceFile, _Index] = weakref.WeakKeyDictionary()


def _index(sf: SourceFile) -> _Index:
    """The file's index, made once per SourceFile: the original is screened against many
    candidates."""
    ix = _INDEXES.get(sf)
    if ix is None:
        ix = _INDEXES[sf] = _Index(sf)
    return ix


def _tainted(aliases: list[tuple[set[str], set[str]]]) -> set[str]:
    """Type aliases that stand for a reserved type (`using E = decltype(cudaSuccess);`), given
    each alias's names and the words of its definition."""
    _, launcher_free = _launcher_names()
    tainted: set[str] = set()
    grew = True
    while grew:
        grew = False
        for own, words in aliases:
            if own <= tainted:
                continue
            if "decltype" in words or any(
                _RESERVED_PREFIX.match(w) or w in launcher_free or w in tainted for w in words
            ):
                tainted |= own
                grew = True
    return tainted


def _is_main(sf: SourceFile, it: _Item) -> bool:
    name = _declared(it.node) if it.node.type == "function_definition" else None
    return not it.scope and name is not None and sf.node_text(name) == "main"


def _is_host(ix: _Index, it: _Item) -> bool:
    """Whether an item is host code, which must be the original's: anything but device code,
    device data, constants, compile-time declarations, device headers and macros."""
    sf, node, t = ix.sf, it.node, it.node.type
    if t == "function_definition":
        return not it.space & _DEVICE_SPACES
    if t == "declaration":
        if _function_declarator(node) is not None:
            return not _space(node) & _DEVICE_SPACES
        return _host_data(ix, node)
    if t == "preproc_include":
        return not _device_header(sf, node)
    if t == "preproc_call":
        directive, arg = _directive(sf, node)
        return directive not in ("#error", "#warning") and (directive, arg) != ("#pragma", "once")
    if t == "using_declaration":
        return not _device_namespace(sf, node)
    if t == "template_instantiation":
        name = _declared(node)
        base = sf.node_text(name).split("<")[0] if name is not None else ""
        return not (_space(node) & _DEVICE_SPACES or base in ix.device_fns)
    return t not in _COMPILE_TIME


def _host_data(ix: _Index, node: Node) -> bool:
    """Whether a file-scope variable is host data that must be the original's: not device-side,
    not constexpr, not a const scalar with a constant initializer."""
    quals = _qualifiers(node)
    if quals & _DEVICE_DATA:
        return False
    if "extern" in quals:
        return True
    return "constexpr" not in quals and _not_const_scalar(ix, node) is not None


def _not_const_scalar(ix: _Index, node: Node) -> Node | None:
    """None where a declaration is of const scalars with constant initializers (nothing runs to
    initialize them); else the node that makes it otherwise."""
    sf = ix.sf
    type_node = node.child_by_field_name("type")
    if type_node is None:
        return node
    type_name = sf.node_text(type_node)
    scalar = type_node.type in ("primitive_type", "sized_type_specifier") or (
        type_node.type in ("type_identifier", "placeholder_type_specifier")
        and (type_name in SCALAR_TYPES or type_name in ix.enums)
    )
    if not scalar:
        return type_node
    const = "const" in _qualifiers(node)
    for d in node.children_by_field_name("declarator"):
        top = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
        if top is not None and top.type == "pointer_declarator":
            if not any(
                sf.node_text(c) == "const" for c in top.children if c.type == "type_qualifier"
            ):
                return d
        elif not const:
            return d
        value = d.child_by_field_name("value") if d.type == "init_declarator" else None
        if value is not None and (bad := _not_constant(sf, value, ix.macro_defs, frozenset())):
            return bad
    return None


def _not_constant(
    sf: SourceFile, node: Node, defs: dict[str, tuple[str | None, str]], seen: frozenset[str]
) -> Node | None:
    """The first part of an initializer that may not be a constant: a call (casts aside), a
    lambda, a function-like macro, an object-like macro whose text is not a constant."""
    t = node.type
    if t == "identifier":
        name = sf.node_text(node)
        if name in seen or name not in defs:
            return None
        params, body = defs[name]
        fragment = _fragment(f"int x = ({body});")
        init = next((n for n in walk(fragment.tree.root_node) if n.type == "init_declarator"), None)
        value = init.child_by_field_name("value") if init is not None else None
        if params is not None or value is None or fragment.tree.root_node.has_error:
            return node
        return node if _not_constant(fragment, value, defs, seen | {name}) else None
    if t == "call_expression":
        fn = node.child_by_field_name("function")
        name = fn.child_by_field_name("name") if fn is not None else None
        cast = fn is not None and (
            fn.type == "primitive_type"
            or (fn.type == "template_function" and sf.node_text(name) == "static_cast")
        )
        args = node.child_by_field_name("arguments")
        if not cast:
            return node
        return _not_constant(sf, args, defs, seen) if args is not None else None
    if t not in _CONSTANT_PARTS:
        return node
    for c in node.named_children:
        if (bad := _not_constant(sf, c, defs, seen)) is not None:
            return bad
    return None


def _directive(sf: SourceFile, node: Node) -> tuple[str, str]:
    """`#pragma` and `once` of a `preproc_call`, spacing normalized."""
    d, a = node.child_by_field_name("directive"), node.child_by_field_name("argument")
    return (
        " ".join(sf.node_text(d).split()) if d is not None else "",
        " ".join(sf.node_text(a).split()) if a is not None else "",
    )


def _device_header(sf: SourceFile, node: Node) -> bool:
    """An include of a CUDA device or maths header (by a path that stays in it)."""
    path = node.child_by_field_name("path")
    if path is None or path.type not in ("system_lib_string", "string_literal"):
        return False
    name = sf.node_text(path)[1:-1].strip()
    if ".." in name or name.startswith("/") or "\\" in name:
        return False
    return name in DEVICE_HEADERS or name.startswith(DEVICE_HEADER_PREFIXES)


def _device_namespace(sf: SourceFile, node: Node) -> bool:
    """`using namespace nvcuda;` and the like: a device library's namespace."""
    if not any(c.type == "namespace" for c in node.children) or not node.named_children:
        return False
    return sf.node_text(node.named_children[-1]).split("::")[0].strip() in DEVICE_NAMESPACES


# ---- the screen -----------------------------------------------------------------------------------


class _Screen:
    """One screening: the two files' items, what the host code kept uses, and the findings."""

    def __init__(self, original: SourceFile, candidate: SourceFile, kernel: str):
        self.cand = candidate
        self.kernel = kernel
        self.found: dict[tuple[int, int, str], Finding] = {}
        self.o, self.c = _index(original), _index(candidate)
        self.orig_keys = set(self.o.keys)
        self.orig_host = [k for k, host in zip(self.o.keys, self.o.host, strict=True) if host]
        self.macros = self.c.macros
        launcher_words, self.launcher_free = _launcher_names()
        # The host code kept from the original, and the words no new macro may take: its own
        # (but `main`'s, which is blanked before compiling) and the launcher's.
        self.kept_host = [
            (it, key)
            for it, key, host in zip(self.c.items, self.c.keys, self.c.host, strict=True)
            if host and key in self.orig_keys
        ]
        self.host_words = set(launcher_words)
        for it, key in self.kept_host:
            if not _is_main(candidate, it):
                self.host_words.update(t for t in key[1] if _IDENTIFIER.match(t))
            self.host_words |= it.guards

    def run(self) -> list[Finding]:
        self._host_order()
        for it, key, host in zip(self.c.items, self.c.keys, self.c.host, strict=True):
            if key in self.orig_keys:
                continue
            self._common(it)
            if host:
                self._host_item(it)
            else:
                self._item(it)
        self._new_namespaces()
        self._removed_macros()
        self._hazards()
        return sorted(self.found.values(), key=lambda f: (f.line, f.column, f.message))

    def _add(self, where: Node | int, message: str) -> None:
        """A finding at a node's start, or at a byte offset."""
        if isinstance(where, int):
            line, col = self.cand.line_col(self.cand._offset(where))
        else:
            line, col = self.cand.span(where).start_point
        self.found.setdefault(
            (line, col, message), Finding(line=line + 1, column=col + 1, message=message)
        )

    def _text(self, node: Node | None) -> str:
        return " ".join(self.cand.node_text(node).split()) if node is not None else ""

    # -- host code: the original's, in its order ---------------------------------------------------

    def _host_order(self) -> None:
        """The host code kept must stand in the original's order: what is out of the longest
        common order of the two is reported as moved."""
        kept = [key for _, key in self.kept_host]
        matcher = SequenceMatcher(None, self.orig_host, kept, autojunk=False)
        in_order = {j + k for _, j, size in matcher.get_matching_blocks() for k in range(size)}
        for j, (it, _) in enumerate(self.kept_host):
            if j not in in_order:
                self._add(it.first, f"{self._what(it)} moved: host code keeps the original's order")

    def _host_item(self, it: _Item) -> None:
        """Host code that is not the original's: what it is and why it may not be there."""
        node, t = it.node, it.node.type
        what = self._what(it)
        named = {self._what(o, self.o.sf) for o in self.o.items if o.scope == it.scope}
        verb = "changed" if what in named and "`" in what else "added"
        if t == "function_definition":
            self._add(
                it.first,
                f"{what} {verb}: a candidate of `{self.kernel}` may change only device code "
                f"(__global__ and __device__ functions){self._macro_qualifier(node)}"
                f"{self._align_hint(it)}",
            )
        elif t == "declaration" and _function_declarator(node) is not None:
            self._add(it.first, f"{what} {verb}: a candidate may declare only device functions")
        elif t == "declaration":
            self._host_data_finding(it, verb)
        elif t == "preproc_include":
            self._include(node)
        elif t == "preproc_call":
            self._directive_finding(node, file_scope=True)
        elif t == "using_declaration":
            self._add(
                node,
                f"`{self._text(node)}` added at file scope: it changes what host code's names "
                "resolve to",
            )
        else:
            self._add(it.first, f"{what} {verb}: a candidate may change only device code")

    def _what(self, it: _Item, sf: SourceFile | None = None) -> str:
        """What a host item is, in a few words, with its name."""
        sf = sf or self.cand
        node, t = it.node, it.node.type
        name_node = _declared(node) if t in ("function_definition", "declaration") else None
        name = sf.node_text(name_node) if name_node is not None else ""
        if t == "function_definition":
            return f"host function `{name}`"
        if t == "declaration" and _function_declarator(node) is not None:
            return f"host function declaration `{name}`"
        if t == "declaration":
            return f"file-scope variable `{name}`"
        if t == "preproc_call":
            return f"`{_directive(sf, node)[0]}`"
        text = " ".join(sf.node_text(node).split())
        return f"file-scope `{text[:40]}{'...' if len(text) > 40 else ''}`"

    def _align_hint(self, it: _Item) -> str:
        """tree-sitter-cuda reads `__align__(16)` only inside a function body; elsewhere a type or
        a variable with it does not parse: the hint to write the standard `alignas(16)`."""
        if "__align__" in self.c.tokens(it.nodes):
            return "; the screen's parser does not read `__align__(N)` here: write `alignas(N)`"
        return ""

    def _macro_qualifier(self, fn: Node) -> str:
        """Where a definition without qualifiers starts with a macro of the file (`HD float f()`),
        the hint to write the qualifiers out: the tree does not expand macros."""
        for c in fn.children:
            if c.type == "type_identifier" and self.cand.node_text(c) in self.macros:
                return f"; `{self.cand.node_text(c)}` is a macro: write its qualifiers out"
        return ""

    def _removed_macros(self) -> None:
        """A macro of the original that the kept host code uses may not be left out."""
        kept = [
            (it, set(key[1]) | it.guards)
            for it, key in self.kept_host
            if not _is_main(self.cand, it)
        ]
        for name in sorted(self.o.macro_defs.keys() - self.c.macro_defs.keys()):
            user = next((it for it, words in kept if name in words), None)
            if user is not None:
                self._add(
                    user.first,
                    f"macro `{name}`, which this host code uses, was removed: host code stays "
                    "the original's",
                )

    def _host_data_finding(self, it: _Item, verb: str) -> None:
        node = it.node
        if "extern" in _qualifiers(node):
            name = self._text(_declared(node))
            self._add(
                it.first, f"`extern` declaration of `{name}` {verb}: host code stays the original's"
            )
            return
        bad = _not_const_scalar(self.c, node)
        if bad is not None and bad.type in (
            "type_identifier",
            "qualified_identifier",
            "template_type",
            *_TYPES,
        ):
            why = (
                "a value of class type has a constructor, which runs when the object is loaded; "
                "make it constexpr, or __device__/__constant__ data"
            )
        else:
            why = (
                "host data is initialized when the object is loaded; only __device__/__constant__ "
                "data and constexpr or const scalar constants may be added"
            )
        self._add(it.first, f"{self._what(it)} {verb}: {why}")

    # -- what every changed item is screened for ---------------------------------------------------

    def _common(self, it: _Item) -> None:
        """What no changed item may hold, whatever it is: parse errors (but harmless ones in a
        device function's body), line continuations outside directives, load-time attributes,
        `__managed__` memory, `_Pragma`, directives other than `#pragma unroll` in code."""
        hint = self._align_hint(it)
        for node in it.nodes:
            for n in walk(node):
                t = n.type
                if (t == "ERROR" or n.is_missing) and not self._harmless_error(it, n):
                    what = f"`{t}` missing" if n.is_missing else "does not parse here"
                    self._add(n, f"{what}: the screen cannot tell what this code is{hint}")
                elif t in ("attribute_specifier", "attribute"):
                    self._attribute(n)
                elif t == "__managed__":
                    self._add(
                        n,
                        "`__managed__` memory: host code could read and write it behind the "
                        "runner's back",
                    )
                elif t == "identifier" and self.cand.node_text(n) == "_Pragma":
                    self._add(n, "`_Pragma` is not allowed: it issues a pragma from inside code")
                elif t in ("identifier", "type_identifier") and self._text(n) in self.macros:
                    self._macro_use(n)
                elif t == "preproc_call" and n != it.node:
                    self._directive_finding(n, file_scope=False)
                elif t == "gnu_asm_expression" and self._asm_label(n):
                    self._add(
                        n,
                        "asm label: it gives a function or a variable another symbol's name",
                    )

    def _hazards(self) -> None:
        """A lexical hazard (`_HAZARD`) the original does not have in the same place: also in
        host code whose tokens are the original's, where joining two of them, or ending a comment
        early, makes another program."""
        for where, at in self.c.hazards.items():
            if where in self.o.hazards:
                continue
            chars = where[0]
            if chars in DIGRAPHS:
                why = f"digraph `{chars}`: the compiler reads it as `{DIGRAPHS[chars]}`"
            elif chars in _SPLICES:
                why = "line continuation outside a directive: the compiler joins these lines"
            elif chars == "\r":
                why = "carriage return without a line feed: the compiler ends the line there"
            else:
                why = "NUL character: one compiler drops it, another stops there"
            self._add(at, f"{why}, the screen does not")

    def _macro_use(self, n: Node) -> None:
        """A macro the tree does not expand: one whose brackets do not balance could end a
        function early; outside a function body, one with a `;` or a body-like `{` could declare
        what the screen never sees (`__device__ int v = M;` with `M` = `1; void f() {...} int w = 1`)."""
        name = self._text(n)
        body = self.macros[name]
        if n.parent is not None and n.parent.type in (*_MACROS, "preproc_defined"):
            return  # its definition, or `defined(NAME)`: not a use
        if name in self.c.unbalanced:
            self._add(
                n,
                f"macro `{name}` has unbalanced brackets: here it could end a function where the "
                "screen sees it go on",
            )
            return
        p = n.parent
        while p is not None and p.type != "compound_statement":
            p = p.parent
        if p is None and (";" in body or "{" in body[1:]):
            self._add(
                n,
                f"macro `{name}` outside a function body holds `;` or `{{`: it could declare "
                "code the screen does not see",
            )

    def _asm_label(self, n: Node) -> bool:
        """`int f() asm("name");` at namespace or class scope (not `register ... asm("r1")` in
        a body): the symbol is renamed, to one the launcher or the runtime may define."""
        if n.parent is None or n.parent.type not in (
            "declaration",
            "field_declaration",
            "function_definition",
            "init_declarator",
        ):
            return False
        p = n.parent
        while p is not None and p.type not in ("compound_statement", "lambda_expression"):
            p = p.parent
        return p is None

    def _harmless_error(self, it: _Item, n: Node) -> bool:
        """A parse error inside a device-only function's body that holds no brace: tree-sitter
        stumbles on `__align__(16)` and on `#pragma unroll` before an unbraced loop. Device code
        there cannot turn into host code as long as the body ends where the tree says; and the
        missing `;` that splits `__cluster_dims__(...)` from its definition."""
        if len(it.nodes) > 1 and n.is_missing and n.end_byte <= it.nodes[1].start_byte:
            return True
        if (n.type in ("{", "}")) if n.is_missing else any(c.type in ("{", "}") for c in walk(n)):
            return False
        fn = n.parent
        while fn is not None and fn.type != "function_definition":
            fn = fn.parent
        if fn is None:
            return False
        space = it.space if fn.id == it.nodes[-1].id or fn.id == it.node.id else _space(fn)
        body = fn.child_by_field_name("body")
        return (
            bool(space & _DEVICE_SPACES)
            and "__host__" not in space
            and body is not None
            and body.start_byte < n.start_byte
            and n.end_byte <= body.end_byte
        )

    def _attribute(self, n: Node) -> None:
        """`__attribute__((...))` and `[[...]]`: only attributes that change no symbol and add
        nothing to what runs when the object is loaded."""
        names: list[Node] = []
        if n.type == "attribute_specifier":
            args = n.named_children[0] if n.named_children else None
            for a in args.named_children if args is not None else []:
                head = a.child_by_field_name("function") if a.type == "call_expression" else a
                names.append(head if head is not None else a)
        else:
            names.append(n.child_by_field_name("name") or n)
        for name in names:
            word = self.cand.node_text(name)
            if word not in ALLOWED_ATTRIBUTES:
                self._add(
                    name,
                    f"attribute `{word}` is not allowed: constructor, destructor, section and the "
                    "like change what runs when the object is loaded",
                )

    def _directive_finding(self, node: Node, *, file_scope: bool) -> None:
        directive, arg = _directive(self.cand, node)
        word = re.split(r"[\s(]", arg, maxsplit=1)[0] if arg else ""
        if directive == "#undef":
            self._add(node, f"`#undef {arg}`: a candidate may not undefine macros")
        elif directive == "#line":
            self._add(node, "`#line` is not allowed: it changes where the compiler says code is")
        elif directive == "#pragma" and not (not file_scope and word in BODY_PRAGMAS):
            where = "at file scope" if file_scope else "in code (only unroll and nounroll are)"
            self._add(node, f"`#pragma {arg}` added {where}: pragmas change how the file builds")
        elif directive not in ("#pragma", "#error", "#warning"):
            self._add(node, f"`{directive}` is not allowed in a candidate")

    # -- items that may differ ---------------------------------------------------------------------

    def _item(self, it: _Item) -> None:
        node, t = it.node, it.node.type
        if t == "function_definition":
            self._function(node, it.space)
        elif t == "declaration":
            self._declaration(node)
        elif t in _TYPES:
            self._type(node)
        elif t == "enum_specifier":
            self._enum(node)
        elif t in ("type_definition", "alias_declaration"):
            self._alias(node)
        elif t == "namespace_alias_definition":
            self._name(node.child_by_field_name("name"), "device")
        elif t in _MACROS:
            self._macro(node)
        elif t == "expression_statement":
            self._file_scope_statement(node)
        elif t == "template_instantiation":
            self._device_code(node, host=False)

    def _function(self, fn: Node, space: frozenset[str]) -> None:
        """A device function: no runtime calls, no launches; compiled for the host too (`__host__
        __device__`), nothing that reaches a host capability, and not named like what host code
        calls."""
        host = "__host__" in space
        name = _declared(fn)
        if name is not None and name.type in ("identifier", "template_function"):
            self._name(name, "host" if host else "device")
            word = self.cand.node_text(name).split("<")[0]
            if host and word in self.host_words:
                self._add(
                    name,
                    f"`__host__ __device__` function `{word}` is named like something host code "
                    "calls: it could be called instead",
                )
        if host and name is not None and name.type == "operator_name":
            self._host_operator(fn, name)
        self._device_code(fn, host)

    def _host_operator(self, fn: Node, name: Node) -> None:
        """A host-compiled operator: not the global allocator's, not one on a type the kept host
        code or the launcher uses (`e != cudaSuccess`), where it could replace the one they
        call."""
        if any(c.type in ("new", "delete") for c in name.children):
            self._add(
                name,
                f"`__host__ __device__ {self._text(name)}` replaces the host's allocator",
            )
            return
        fd = _function_declarator(fn)
        params = fd.child_by_field_name("parameters") if fd is not None else None
        parts = [x for p in params.named_children for x in walk(p)] if params is not None else []
        types = [self._text(x) for x in parts if x.type == "type_identifier"]
        used = next((t for t in types if t in self.host_words), None)
        if used is not None:
            self._add(
                name,
                f"`__host__ __device__ {self._text(name)}` on `{used}`, a type host code uses: "
                "it could be picked there",
            )
            return
        if any(t in self.c.classes for t in types):
            return  # an operand of the candidate's own type: neither the launcher nor host code has one
        for p in params.named_children if params is not None else []:
            for x in walk(p):
                word = self.cand.node_text(x)
                if x.type == "decltype" or (
                    x.type in ("type_identifier", "identifier")
                    and (
                        _RESERVED_PREFIX.match(word)
                        or word in self.launcher_free
                        or word in self.c.tainted
                    )
                ):
                    self._add(
                        name,
                        f"`__host__ __device__ {self._text(name)}` on `{self._text(x)}`: it "
                        "could replace the built-in operator in the launcher's checks",
                    )
                    return

    def _device_code(self, node: Node, host: bool) -> None:
        """Device code (a function, a device variable's initializer): no kernel launches, no CUDA
        runtime; where `host`, nothing that reaches a host capability, and `asm` only in the
        device pass's branch of `#ifdef __CUDA_ARCH__`."""
        sf = self.cand
        local = self._local_names(node) if host else set()
        for n in walk(node):
            t = n.type
            word = sf.node_text(n) if n.child_count == 0 else ""
            if t == "kernel_call_syntax":
                self._add(
                    n.parent,
                    "kernel launch in device code: dynamic parallelism moves work off the timed "
                    "stream",
                )
            elif t == "identifier" and _RUNTIME_NAME.match(word):
                self._add(
                    n,
                    f"`{word}` in device code: device-side runtime calls and launches are not "
                    "allowed",
                )
            elif t in _MACROS:
                self._macro(n)
            elif t == "preproc_include":
                self._include(n)
            elif not host:
                continue
            elif (
                t in ("identifier", "type_identifier", "namespace_identifier")
                and _is_capability(word)
                and word not in local
            ):
                self._add(
                    n,
                    f"`{word}` in a `__host__ __device__` function: host-compiled code may not "
                    "reach files, processes, the environment or exit handlers",
                )
            elif t == "gnu_asm_expression" and not self._device_pass(n):
                self._add(
                    n,
                    "`asm` in a `__host__ __device__` function outside `#ifdef __CUDA_ARCH__`: "
                    "it is compiled for the host too",
                )
            elif t == "identifier" and word in self.macros and word not in local:
                self._expansion(n)

    def _local_names(self, node: Node) -> set[str]:
        """Names a function declares itself (parameters, locals): `read` there is a variable."""
        return {
            self.cand.node_text(n) for n in walk(node) if n.type == "identifier" and _declares(n)
        }

    def _expansion(self, use: Node) -> None:
        """A macro used in host-compiled code: what it expands to is host code too."""
        name = self.cand.node_text(use)
        seen, todo = {name}, [name]
        while todo:
            for tok in self.macros.get(todo.pop(), ()):
                if _is_capability(tok) or _RUNTIME_NAME.match(tok):
                    self._add(
                        use,
                        f"macro `{name}` brings `{tok}` into a `__host__ __device__` function: "
                        "host-compiled code may not reach host capabilities",
                    )
                    return
                if tok in ("asm", "__asm__", "__asm") and not self._device_pass(use):
                    self._add(
                        use,
                        f"macro `{name}` brings `asm` into a `__host__ __device__` function "
                        "outside `#ifdef __CUDA_ARCH__`",
                    )
                    return
                if tok in self.macros and tok not in seen:
                    seen.add(tok)
                    todo.append(tok)

    def _device_pass(self, n: Node) -> bool:
        """Whether `n` is in the device pass's branch of an `#if` inside its function:
        `#ifdef __CUDA_ARCH__`, `#if defined(__CUDA_ARCH__)`, `#if __CUDA_ARCH__ >= 700`, or a
        conjunction with one of them."""
        child, p = n, n.parent
        while p is not None and p.type != "function_definition":
            if p.type in ("preproc_ifdef", "preproc_if", "preproc_elif"):
                alt = p.child_by_field_name("alternative")
                if not (alt is not None and alt.start_byte <= child.start_byte < alt.end_byte):
                    if p.type == "preproc_ifdef":
                        if (
                            p.children[0].type == "#ifdef"
                            and self._text(p.child_by_field_name("name")) == "__CUDA_ARCH__"
                        ):
                            return True
                    elif self._device_condition(p.child_by_field_name("condition")):
                        return True
            child, p = p, p.parent
        return False

    def _device_condition(self, c: Node | None) -> bool:
        """A condition true in the device pass only (on the host `__CUDA_ARCH__` is undefined,
        which `#if` reads as 0)."""
        if c is None:
            return False
        if c.type == "parenthesized_expression" and c.named_child_count == 1:
            return self._device_condition(c.named_children[0])
        if c.type == "preproc_defined":
            return any(self._text(x) == "__CUDA_ARCH__" for x in c.named_children)
        if c.type == "identifier":
            return self._text(c) == "__CUDA_ARCH__"
        if c.type != "binary_expression":
            return False
        op = self._text(c.child_by_field_name("operator"))
        left, right = c.child_by_field_name("left"), c.child_by_field_name("right")
        if op == "&&":
            return self._device_condition(left) or self._device_condition(right)
        if self._text(left) != "__CUDA_ARCH__" or right is None or right.type != "number_literal":
            return False
        try:
            value = int(self._text(right).rstrip("uUlL"), 0)
        except ValueError:
            return False
        return (op in (">=", "==") and value > 0) or (op == ">" and value >= 0)

    def _declaration(self, node: Node) -> None:
        """A device function's declaration, device data, a constant; types defined in it."""
        type_node = node.child_by_field_name("type")
        if type_node is not None and type_node.type in _TYPES:
            self._type(type_node)
        elif type_node is not None and type_node.type == "enum_specifier":
            self._enum(type_node)
        fd = _function_declarator(node)
        if fd is not None:
            space = _space(node)
            name = fd.child_by_field_name("declarator")
            if name is not None and name.type in ("identifier", "template_function"):
                self._name(name, "host" if "__host__" in space else "device")
            self._device_code(node, "__host__" in space)
            return
        device = bool(_qualifiers(node) & _DEVICE_DATA)
        for d in node.children_by_field_name("declarator"):
            name = d
            while name.child_by_field_name("declarator") is not None:
                name = name.child_by_field_name("declarator")
            if name.type == "identifier":
                self._name(name, "device" if device else "variable")
        if device:
            self._device_code(node, host=False)

    def _name(self, name: Node | None, kind: str) -> None:
        """A declared name. No declaration may take a name the launcher refers to or CUDA's and
        the implementation's prefixes; host-compiled functions and host values (`kind` "host",
        "variable") not the C library's names nor the launcher's prefix either."""
        if name is None:
            return
        word = self.cand.node_text(name)
        if name.type == "template_function":
            word = self._text(name.child_by_field_name("name"))
        why = self._reserved(word)
        if why is None and kind != "device":
            if word in RESERVED_NAMES:
                why = "the C library's"
            elif _LAUNCHER_PREFIX.match(word):
                why = "the launcher's prefix"
        if why:
            self._add(name, f"`{word}` is a reserved name ({why}): a candidate may not declare it")

    def _reserved(self, word: str) -> str | None:
        if word in self.launcher_free:
            return "the launcher uses it"
        if _RESERVED_PREFIX.match(word):
            return "CUDA's or the implementation's"
        return None

    def _type(self, node: Node) -> None:
        """A struct, class or union: its member functions device functions (or defaulted), its
        static data constant; if the host code kept uses the type, none compiled for the host."""
        name = node.child_by_field_name("name")
        if name is not None and name.type == "type_identifier":
            self._name(name, "device")
        used = self._text(name) if name is not None and self._text(name) in self.host_words else ""
        body = node.child_by_field_name("body")
        for m in body.named_children if body is not None else []:
            self._member(m, used)

    def _member(self, m: Node, used: str = "") -> None:
        """One member of a type; `used`: the type's name where host code uses the type."""
        inner = _unwrap(m)
        if inner.type == "friend_declaration":
            named = [
                c for c in inner.named_children if c.type not in ("comment", "type_identifier")
            ]
            if not named:
                return  # `friend class X;`
            inner = _unwrap(named[0])
        t = inner.type
        if t == "function_definition" or (
            t in ("field_declaration", "declaration") and _function_declarator(inner) is not None
        ):
            self._member_function(inner, used)
        elif t in ("field_declaration", "declaration"):
            quals = _qualifiers(inner)
            initialized = inner.child_by_field_name("default_value") is not None or any(
                d.type == "init_declarator" for d in inner.children_by_field_name("declarator")
            )
            if (
                "static" in quals
                and "constexpr" not in quals
                and ("inline" in quals or initialized)
            ):
                self._add(
                    inner,
                    "static data member with an initializer: host data initialized when the "
                    "object is loaded; make it constexpr",
                )
            type_node = inner.child_by_field_name("type")
            if type_node is not None and type_node.type in _TYPES:
                self._type(type_node)
        elif t in _TYPES:
            self._type(inner)
        elif t == "enum_specifier":
            self._enum(inner)
        elif t in _CONDITIONALS:
            for c in _contents(inner):
                self._member(c, used)
        elif t in _MACROS:
            self._macro(inner)
        elif t == "preproc_include":
            self._include(inner)
        elif t not in (
            "comment",
            "access_specifier",
            "type_definition",
            "alias_declaration",
            "using_declaration",
            "static_assert_declaration",
            "preproc_call",
            "ERROR",
        ):
            self._add(inner, "a type member the screen cannot read")

    def _member_function(self, fn: Node, used: str) -> None:
        space = _space(fn)
        defaulted = any(
            c.type in ("default_method_clause", "delete_method_clause") for c in fn.children
        )
        if space & _DEVICE_SPACES:
            self._device_code(fn, "__host__" in space)
            if "__host__" in space and used:
                self._add(
                    fn,
                    f"`__host__ __device__` member of `{used}`, a type host code uses: it would "
                    "run in the original's host code",
                )
        elif not defaulted:
            self._add(
                fn,
                f"host member function `{self._text(_declared(fn))}`: members of a candidate's "
                "types must be __device__ (or __host__ __device__) functions",
            )

    def _enum(self, node: Node) -> None:
        """An enum's name and, unless it is scoped, its enumerators (they join the scope)."""
        self._name(node.child_by_field_name("name"), "device")
        body = node.child_by_field_name("body")
        if body is not None and not any(c.type in ("class", "struct") for c in node.children):
            for e in body.named_children:
                if e.type == "enumerator":
                    self._name(e.child_by_field_name("name"), "device")

    def _alias(self, node: Node) -> None:
        for c in node.named_children:
            if c.type in _TYPES:
                self._type(c)
            elif c.type == "enum_specifier":
                self._enum(c)
        for d in node.children_by_field_name("declarator") or [node.child_by_field_name("name")]:
            if d is not None and d.type == "type_identifier":
                self._name(d, "device")

    def _new_namespaces(self) -> None:
        """A namespace the original does not have may not take a reserved name (`namespace std`)."""
        for n in self.c.namespace_nodes:
            name = n.child_by_field_name("name")
            if self._text(name) not in self.o.namespaces:
                self._name(name, "device")
                if self._text(name) in RESERVED_NAMES:
                    self._add(name, f"namespace `{self._text(name)}` is the standard library's")

    # -- preprocessor ------------------------------------------------------------------------------

    def _macro(self, node: Node) -> None:
        """A new or changed macro: not named like anything the launcher, CUDA or the host code
        kept uses; its text balanced and free of what the screen refuses elsewhere."""
        if self.c.tokens((node,)) in self.o.macro_keys:
            return
        name_node = node.child_by_field_name("name")
        name = self._text(name_node)
        why = self._reserved(name)
        if why is None and name in KEYWORDS:
            why = "a keyword"
        elif why is None and name in RESERVED_NAMES:
            why = "the C library's"
        elif why is None and name in self.host_words:
            why = "host code or the launcher uses it"
        elif why is None and _LAUNCHER_PREFIX.match(name) and not self._include_guard(node):
            why = "the launcher's prefix"
        if why:
            self._add(name_node, f"`#define {name}`: a reserved name ({why})")
        body = self.macros.get(name, ())
        if not _brackets_balanced(body):
            self._add(
                name_node,
                f"macro `{name}` has unbalanced brackets: it could end a function where the "
                "screen sees it go on",
            )
        for tok in body:
            if tok == "_Pragma":
                self._add(name_node, f"macro `{name}` issues a pragma")
            elif tok == "__managed__":
                self._add(name_node, f"macro `{name}` declares `__managed__` memory")
            elif tok in LOAD_ATTRIBUTES:
                self._add(name_node, f"macro `{name}` holds the attribute `{tok}`")
            elif _is_capability(tok) or _RUNTIME_NAME.match(tok):
                self._add(
                    name_node,
                    f"macro `{name}` uses `{tok}`: a candidate may not reach host capabilities or "
                    "the CUDA runtime",
                )
            elif tok == "<<<":
                self._add(name_node, f"macro `{name}` launches a kernel")
            else:
                continue
            break

    def _include_guard(self, node: Node) -> bool:
        """`#ifndef X` then `#define X` with no text: how the catalog's helpers are guarded."""
        p = node.parent
        guard = (
            p.child_by_field_name("name") if p is not None and p.type == "preproc_ifdef" else None
        )
        return (
            guard is not None
            and node.type == "preproc_def"
            and p.children[0].type == "#ifndef"
            and self._text(guard) == self._text(node.child_by_field_name("name"))
            and node.child_by_field_name("value") is None
        )

    def _include(self, node: Node) -> None:
        if _device_header(self.cand, node) or self.c.tokens((node,)) in self.o.include_keys:
            return
        self._add(
            node,
            f"`{self._text(node)}` added: a candidate may include only CUDA device and math "
            "headers, or what the original includes",
        )

    def _file_scope_statement(self, node: Node) -> None:
        inner = node.named_children[0] if node.named_children else node
        if inner.type == "gnu_asm_expression":
            self._add(node, "file-scope `asm`: it is host assembly, not device code")
        elif not (
            inner.type == "call_expression"
            and self._text(inner.child_by_field_name("function")) == "_Pragma"
        ):
            self._add(
                node,
                "code at file scope the screen cannot read (a macro that expands to "
                "declarations?): write out what it declares",
            )

    # -- what a file defines -----------------------------------------------------------------------
