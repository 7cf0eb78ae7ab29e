#!/usr/bin/env python3
"""Generates the low-level binding layers of FLAME from include/flame.h.

Outputs (checked in; CI regenerates them and fails on any difference):
  bindings/rust/src/sys.rs      raw declarations: constants, enums (as integer aliases, constants
                                and a newtype with associated constants), opaque handles, repr(C)
                                structs, callback types, and `Api`, a table of function pointers
                                resolved once at load time through a caller-supplied resolver.
  bindings/rust/src/ops.rs      safe methods generated for every function of a regular shape
                                (Tensor/Context receiver, scalar/slice inputs, trailing outputs).
  bindings/csharp/Native.g.cs   DllImport("flame") declarations, enums, StructLayout.Sequential
                                structs, Cdecl delegates, constants.
  bindings/csharp/Ops.g.cs      the C# counterpart of ops.rs (partial classes Tensor/Context).

The header is regular: `FLAME_API <ret> <name>(<params>);`, enums with explicit values, typedef'd
opaque handles, forward-declared foreign structs used only through pointers (`struct DLManagedTensor;`),
function-pointer typedefs, plain structs and integer #defines. Anything else is an
error: the script stops with the offending declaration rather than silently skipping it.

Usage: gen_bindings.py [--header include/flame.h] [--check]
  --check  compare instead of writing; exit 1 listing the files that differ.
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ParseError(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------

class CType:
    """base: a C type name; base_const: const applies to base; ptr_consts: one bool per '*' level
    (whether that pointer itself is const); array: fixed array length (struct fields) or None."""

    def __init__(self, base, base_const=False, ptr_consts=(), array=None):
        self.base, self.base_const, self.ptr_consts, self.array = base, base_const, list(ptr_consts), array

    @property
    def depth(self):
        return len(self.ptr_consts)

    def pointee(self):
        assert self.depth > 0
        if self.depth == 1:
            return CType(self.base, self.base_const)
        return CType(self.base, self.base_const, self.ptr_consts[:-1])

    def pointee_const(self):
        """Whether what the outermost pointer points to is const."""
        return self.base_const if self.depth == 1 else self.ptr_consts[-2]

    def c(self):
        s = ("const " if self.base_const else "") + self.base
        for pc in self.ptr_consts:
            s += "*" + (" const" if pc else "")
        return s

    def is_(self, base, depth=0):
        return self.base == base and self.depth == depth


class Param:
    def __init__(self, ctype, name):
        self.type, self.name = ctype, name


class Func:
    def __init__(self, name, ret, params, decl):
        self.name, self.ret, self.params, self.decl = name, ret, params, decl


class Enum:
    def __init__(self, name, entries):
        self.name, self.entries = name, entries  # name None: anonymous


class Struct:
    def __init__(self, name, fields):
        self.name, self.fields = name, fields


class FnPtr:
    def __init__(self, name, ret, params):
        self.name, self.ret, self.params = name, ret, params


class Header:
    def __init__(self):
        self.defines = []   # (name, int value)
        self.enums = []
        self.handles = []   # (typedef name, struct tag)
        self.opaque = []    # struct tags declared `struct X;` (foreign types, used through pointers)
        self.structs = []
        self.fnptrs = []
        self.funcs = []

    def typedef_kind(self, name):
        for e in self.enums:
            if e.name == name:
                return "enum"
        for h, _ in self.handles:
            if h == name:
                return "handle"
        for s in self.structs:
            if s.name == name:
                return "struct"
        for f in self.fnptrs:
            if f.name == name:
                return "fnptr"
        if name in self.opaque:
            return "opaque"
        return None


PRIMITIVES = {"void", "char", "int", "unsigned", "float", "double", "size_t", "int8_t", "uint8_t",
              "int16_t", "uint16_t", "int32_t", "uint32_t", "int64_t", "uint64_t", "intptr_t",
              "uintptr_t", "ptrdiff_t"}


# ----------------------------------------------------------------------------------------------
# Parser
# ----------------------------------------------------------------------------------------------

def strip_comments(text):
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise ParseError("unterminated comment")
            out.append("\n" * text.count("\n", i, j + 2) or " ")
            i = j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


INT_EXPR = re.compile(r"^[\s0-9a-fA-FxX()+\-*/%<>|&~^]*$")


def eval_int(expr, names, where):
    e = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)([uUlL]+)\b", r"\1", expr.strip())
    for k, v in sorted(names.items(), key=lambda kv: -len(kv[0])):
        e = re.sub(r"\b%s\b" % re.escape(k), "(%d)" % v, e)
    if not e or not INT_EXPR.match(e):
        raise ParseError("cannot evaluate integer expression %r in %s" % (expr, where))
    e = e.replace("/", "//")
    try:
        return int(eval(e, {"__builtins__": {}}, {}))  # noqa: S307 - restricted to integer syntax
    except Exception as ex:  # pragma: no cover
        raise ParseError("cannot evaluate %r in %s: %s" % (expr, where, ex))


def parse_type(s, where, allow_array=False):
    """Parses a C type with an optional trailing declarator name. Returns (CType, name or None)."""
    s = s.strip()
    array = None
    m = re.match(r"^(.*?)\[\s*([^\]]+)\s*\]$", s)
    if m:
        if not allow_array:
            raise ParseError("array declarator not supported here: %r (%s)" % (s, where))
        s, array = m.group(1).strip(), m.group(2)
    toks = re.findall(r"[A-Za-z_]\w*|\*|\S", s)
    base, base_const, ptrs, name = None, False, [], None
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "const":
            if ptrs:
                ptrs[-1] = True
            else:
                base_const = True
        elif t == "*":
            if base is None:
                raise ParseError("pointer before type in %r (%s)" % (s, where))
            ptrs.append(False)
        elif t in ("struct", "enum"):
            pass  # `struct x*` names the tag; handled by lookup of the following identifier
        elif re.match(r"^[A-Za-z_]\w*$", t):
            if base is None:
                base = t
                # multi-word primitives
                while base in ("unsigned", "signed", "long", "short") and i + 1 < len(toks) and \
                        toks[i + 1] in ("int", "long", "char", "short"):
                    i += 1
                    base += " " + toks[i]
            elif name is None and (i == len(toks) - 1):
                name = t
            else:
                raise ParseError("cannot parse type %r (%s)" % (s, where))
        else:
            raise ParseError("unexpected %r in type %r (%s)" % (t, s, where))
        i += 1
    if base is None:
        raise ParseError("no type in %r (%s)" % (s, where))
    return CType(base, base_const, ptrs, array), name


def split_params(s, where):
    s = s.strip()
    if s in ("", "void"):
        return []
    if "(" in s or ")" in s:
        raise ParseError("inline function-pointer parameters are not supported (typedef them): %s" % where)
    params = []
    for i, p in enumerate(s.split(",")):
        t, name = parse_type(p, where)
        if name is None:
            raise ParseError("parameter %d of %s has no name: %r" % (i + 1, where, p.strip()))
        params.append(Param(t, name))
    return params


def preprocess(text, hdr):
    """Handles # lines: collects integer #defines, drops `#ifdef __cplusplus` blocks, keeps every
    other conditional branch (experimental API behind a macro is still API the symbols check sees)."""
    lines = text.split("\n")
    # join continuation lines
    joined, buf = [], ""
    for ln in lines:
        if ln.endswith("\\"):
            buf += ln[:-1] + " "
            continue
        joined.append(buf + ln)
        buf = ""
    out, stack = [], []  # stack of "skip" flags
    names = {}
    for ln in joined:
        st = ln.strip()
        if st.startswith("#"):
            d = re.match(r"#\s*(\w+)\s*(.*)$", st)
            if not d:
                raise ParseError("bad preprocessor line %r" % st)
            kw, rest = d.group(1), d.group(2).strip()
            if kw in ("if", "ifdef", "ifndef"):
                stack.append(kw == "ifdef" and rest == "__cplusplus")
            elif kw in ("else", "elif"):
                if not stack:
                    raise ParseError("#%s without #if" % kw)
                if stack[-1]:
                    stack[-1] = False
            elif kw == "endif":
                if not stack:
                    raise ParseError("#endif without #if")
                stack.pop()
            elif kw == "define" and not any(stack):
                m = re.match(r"(\w+)(\(.*?\))?\s*(.*)$", rest)
                name, fargs, val = m.group(1), m.group(2), m.group(3).strip()
                if name in ("FLAME_API", "FLAME_H") or name.endswith("_H") and val == "":
                    continue
                if fargs:
                    raise ParseError("function-like macro %s is not supported" % name)
                v = eval_int(val, names, "#define " + name)
                names[name] = v
                hdr.defines.append((name, v))
            elif kw in ("include", "undef", "pragma", "error", "warning"):
                pass
            out.append("")
            continue
        out.append("" if any(stack) else ln)
    return "\n".join(out), names


def parse_header(path):
    hdr = Header()
    text = strip_comments(open(path, encoding="utf-8").read())
    text, names = preprocess(text, hdr)
    # split into statements at ';' at brace depth 0
    stmts, depth, cur = [], 0, []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == ";" and depth == 0:
            stmts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        raise ParseError("trailing text without ';': %r" % "".join(cur).strip()[:200])
    for raw in stmts:
        s = " ".join(raw.split())
        if not s:
            continue
        parse_statement(s, hdr, names)
    seen = set()
    for f in hdr.funcs:
        if f.name in seen:
            raise ParseError("duplicate declaration of %s" % f.name)
        seen.add(f.name)
    check_types(hdr)
    return hdr


def parse_enum_body(body, names, where):
    entries = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            continue
        m = re.match(r"^([A-Za-z_]\w*)\s*=\s*(.+)$", item)
        if not m:
            raise ParseError("enum entry without an explicit value in %s: %r" % (where, item))
        v = eval_int(m.group(2), names, where)
        names[m.group(1)] = v
        entries.append((m.group(1), v))
    if not entries:
        raise ParseError("empty enum %s" % where)
    return entries


def parse_statement(s, hdr, names):
    m = re.match(r"^FLAME_API\s+(.+?)\s*\b(flame_\w+)\s*\((.*)\)$", s)
    if m:
        ret, _ = parse_type(m.group(1), m.group(2))
        hdr.funcs.append(Func(m.group(2), ret, split_params(m.group(3), m.group(2)), s))
        return
    if "FLAME_API" in s:
        raise ParseError("cannot parse FLAME_API declaration: %s" % s)
    m = re.match(r"^typedef enum\s*(\w+)?\s*\{(.*)\}\s*(\w+)$", s)
    if m:
        hdr.enums.append(Enum(m.group(3), parse_enum_body(m.group(2), names, m.group(3))))
        return
    m = re.match(r"^enum\s*(\w+)?\s*\{(.*)\}$", s)
    if m:
        if m.group(1):
            raise ParseError("named non-typedef enum %s: use typedef enum" % m.group(1))
        hdr.enums.append(Enum(None, parse_enum_body(m.group(2), names, "anonymous enum")))
        return
    m = re.match(r"^typedef struct\s+(\w+)\s*\*\s*(\w+)$", s)
    if m:
        hdr.handles.append((m.group(2), m.group(1)))
        return
    m = re.match(r"^struct\s+(\w+)$", s)
    if m:
        hdr.opaque.append(m.group(1))
        return
    m = re.match(r"^typedef struct\s*(\w+)?\s*\{(.*)\}\s*(\w+)$", s)
    if m:
        fields = []
        for f in m.group(2).split(";"):
            f = f.strip()
            if not f:
                continue
            t, name = parse_type(f, m.group(3), allow_array=True)
            if name is None:
                raise ParseError("struct %s field without name: %r" % (m.group(3), f))
            if t.array is not None:
                t.array = eval_int(t.array, names, m.group(3) + "." + name)
            fields.append(Param(t, name))
        hdr.structs.append(Struct(m.group(3), fields))
        return
    m = re.match(r"^typedef\s+(.+?)\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)$", s)
    if m:
        ret, _ = parse_type(m.group(1), m.group(2))
        hdr.fnptrs.append(FnPtr(m.group(2), ret, split_params(m.group(3), m.group(2))))
        return
    if s in ('extern "C" {', "}"):
        return
    raise ParseError("cannot parse declaration: %s" % s)


def check_types(hdr):
    def chk(t, where):
        if hdr.typedef_kind(t.base) == "opaque" and t.depth == 0:
            raise ParseError("foreign struct %s used by value in %s (only pointers to it are supported)" % (t.base, where))
        if t.base in PRIMITIVES or hdr.typedef_kind(t.base):
            return
        raise ParseError("unknown type %r in %s" % (t.base, where))
    for s in hdr.structs:
        for f in s.fields:
            chk(f.type, s.name)
    for fp in hdr.fnptrs:
        chk(fp.ret, fp.name)
        for p in fp.params:
            chk(p.type, fp.name)
    for f in hdr.funcs:
        chk(f.ret, f.name)
        for p in f.params:
            chk(p.type, f.name)


# ----------------------------------------------------------------------------------------------
# Naming helpers
# ----------------------------------------------------------------------------------------------

def camel(s):
    return "".join(w[:1].upper() + w[1:] for w in s.split("_") if w)


ENUM_NAME_OVERRIDES = {"flame_dtype_t": "DType"}


def enum_wrapper_name(cname):
    if cname in ENUM_NAME_OVERRIDES:
        return ENUM_NAME_OVERRIDES[cname]
    n = cname
    if n.startswith("flame_"):
        n = n[6:]
    if n.endswith("_t"):
        n = n[:-2]
    return camel(n)


def enum_prefix(e):
    names = [n for n, _ in e.entries]
    guess = "FLAME_" + enum_wrapper_name(e.name).upper() + "_" if e.name else "FLAME_"
    if all(n.startswith(guess) and len(n) > len(guess) and not n[len(guess)].isdigit() for n in names):
        return guess
    if all(n.startswith(guess) for n in names):
        return guess  # digits allowed in Rust/C# after a letter-free prefix? F32 etc. start with a letter
    return "FLAME_"


RUST_KEYWORDS = {"as", "break", "const", "continue", "crate", "else", "enum", "extern", "false", "fn",
                 "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref",
                 "return", "self", "Self", "static", "struct", "super", "trait", "true", "type",
                 "unsafe", "use", "where", "while", "async", "await", "dyn", "abstract", "become",
                 "box", "do", "final", "macro", "override", "priv", "typeof", "unsized", "virtual",
                 "yield", "try", "gen"}

CS_KEYWORDS = {"abstract", "as", "base", "bool", "break", "byte", "case", "catch", "char", "checked",
               "class", "const", "continue", "decimal", "default", "delegate", "do", "double", "else",
               "enum", "event", "explicit", "extern", "false", "finally", "fixed", "float", "for",
               "foreach", "goto", "if", "implicit", "in", "int", "interface", "internal", "is", "lock",
               "long", "namespace", "new", "null", "object", "operator", "out", "override", "params",
               "private", "protected", "public", "readonly", "ref", "return", "sbyte", "sealed",
               "short", "sizeof", "stackalloc", "static", "string", "struct", "switch", "this",
               "throw", "true", "try", "typeof", "uint", "ulong", "unchecked", "unsafe", "ushort",
               "using", "virtual", "void", "volatile", "while"}


def rs_ident(n):
    if n in ("self", "Self", "super", "crate"):
        return n + "_"
    return "r#" + n if n in RUST_KEYWORDS else n


# Safe-method names that would shadow a std trait method of the same name (Clone::clone).
RS_METHOD_OVERRIDES = {"clone": "deep_clone"}


def rs_method(n):
    n = RS_METHOD_OVERRIDES.get(n, n)
    return n + "_" if n in RUST_KEYWORDS else n


def cs_ident(n):
    return "@" + n if n in CS_KEYWORDS else n


# ----------------------------------------------------------------------------------------------
# Rust raw layer
# ----------------------------------------------------------------------------------------------

RS_PRIM = {"void": "c_void", "char": "c_char", "int": "c_int", "unsigned": "c_uint",
           "unsigned int": "c_uint", "float": "f32", "double": "f64", "size_t": "usize",
           "int8_t": "i8", "uint8_t": "u8", "int16_t": "i16", "uint16_t": "u16", "int32_t": "i32",
           "uint32_t": "u32", "int64_t": "i64", "uint64_t": "u64", "intptr_t": "isize",
           "uintptr_t": "usize", "ptrdiff_t": "isize"}


def rs_type(t, hdr):
    base = RS_PRIM.get(t.base, t.base)
    s = base
    for i in range(t.depth):
        const = t.base_const if i == 0 else t.ptr_consts[i - 1]
        s = ("*const " if const else "*mut ") + s
    if t.array is not None:
        s = "[%s; %d]" % (s, t.array)
    return s


def rs_ret(t, hdr):
    if t.is_("void"):
        return ""
    return " -> " + rs_type(t, hdr)


def rs_fn_type(ret, params, hdr, named=True):
    ps = ", ".join(("%s: %s" % (rs_ident(p.name), rs_type(p.type, hdr))) if named else rs_type(p.type, hdr)
                   for p in params)
    return 'unsafe extern "C" fn(%s)%s' % (ps, rs_ret(ret, hdr))


def int_rs_type(v):
    return "i32" if -2**31 <= v < 2**31 else "i64"


def gen_rust_sys(hdr):
    o = []
    w = o.append
    w("// @generated by scripts/gen_bindings.py from include/flame.h. DO NOT EDIT.")
    w("// Regenerate with `python3 scripts/gen_bindings.py`; CI fails when this file is stale.")
    w("#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, dead_code)]")
    w("#![allow(clippy::all)]")
    w("")
    w("use std::os::raw::{c_char, c_int, c_uint, c_void};")
    w("")
    w("// ---- #define constants ----")
    for n, v in hdr.defines:
        w("pub const %s: %s = %d;" % (n, int_rs_type(v), v))
    w("")
    w("// ---- enums: C integer type, constants, and a newtype with associated constants ----")
    w("// (a Rust enum would be undefined behaviour for values added by a newer library)")
    for e in hdr.enums:
        if e.name is None:
            ty = "u32" if all(v >= 0 for _, v in e.entries) else "i32"
            for n, v in e.entries:
                w("pub const %s: %s = %d;" % (n, ty, v))
            w("")
            continue
        w("pub type %s = i32;" % e.name)
        for n, v in e.entries:
            w("pub const %s: %s = %d;" % (n, e.name, v))
        wn, pre = enum_wrapper_name(e.name), enum_prefix(e)
        w("")
        w("/// `%s` as a Rust newtype; unknown values are representable." % e.name)
        w("#[repr(transparent)]")
        w("#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]")
        w("pub struct %s(pub %s);" % (wn, e.name))
        w("impl %s {" % wn)
        for n, v in e.entries:
            w("    pub const %s: %s = %s(%d);" % (n[len(pre):], wn, wn, v))
        w("    /// Every value the header defines, with its C name.")
        w("    pub const ALL: &'static [(%s, &'static str)] = &[" % wn)
        for n, v in e.entries:
            w('        (%s(%d), "%s"),' % (wn, v, n))
        w("    ];")
        w("    /// The C name of the value (\"%s\"), or None for a value this header does not know." % e.entries[0][0])
        w("    pub fn c_name(self) -> Option<&'static str> {")
        w("        Self::ALL.iter().find(|(v, _)| *v == self).map(|(_, n)| *n)")
        w("    }")
        w("}")
        w("impl std::fmt::Debug for %s {" % wn)
        w("    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {")
        w("        match self.c_name() {")
        w("            Some(n) => f.write_str(n),")
        w('            None => write!(f, "%s({})", self.0),' % wn)
        w("        }")
        w("    }")
        w("}")
        w("")
    w("// ---- opaque handles ----")
    for name, tag in hdr.handles:
        w("#[repr(C)]")
        w("pub struct %s {" % tag)
        w("    _opaque: [u8; 0],")
        w("}")
        w("pub type %s = *mut %s;" % (name, tag))
    w("")
    w("// ---- foreign structs, declared only (defined by their own headers, e.g. dlpack.h) ----")
    for tag in hdr.opaque:
        w("#[repr(C)]")
        w("pub struct %s {" % tag)
        w("    _opaque: [u8; 0],")
        w("}")
    w("")
    w("// ---- callback types ----")
    for fp in hdr.fnptrs:
        w("pub type %s = Option<%s>;" % (fp.name, rs_fn_type(fp.ret, fp.params, hdr)))
    w("")
    w("// ---- structs ----")
    for st in hdr.structs:
        w("#[repr(C)]")
        w("#[derive(Debug, Clone, Copy)]")
        w("pub struct %s {" % st.name)
        for f in st.fields:
            w("    pub %s: %s," % (rs_ident(f.name), rs_type(f.type, hdr)))
        w("}")
        w("")
    w("// ---- functions ----")
    w("/// Every exported function, in header order.")
    w("pub const SYMBOLS: &[&str] = &[")
    for f in hdr.funcs:
        w('    "%s",' % f.name)
    w("];")
    w("")
    w("/// The function table: every symbol of the header, resolved once when the library loads.")
    w("pub struct Api {")
    for f in hdr.funcs:
        w("    pub %s: %s," % (f.name, rs_fn_type(f.ret, f.params, hdr)))
    w("}")
    w("")
    w("impl Api {")
    w("    /// Resolves every symbol through `resolve`, which gets a NUL-terminated name and returns a")
    w("    /// non-null address or an error message. The first failure is returned.")
    w("    ///")
    w("    /// # Safety")
    w("    /// `resolve` must return addresses of functions with exactly the declared C signatures.")
    w("    pub unsafe fn load(")
    w("        resolve: &mut dyn FnMut(&'static [u8]) -> Result<*mut c_void, String>,")
    w("    ) -> Result<Api, String> {")
    w("        Ok(Api {")
    for f in hdr.funcs:
        w("            %s: std::mem::transmute::<*mut c_void, %s>(resolve(b\"%s\\0\")?)," % (
            f.name, rs_fn_type(f.ret, f.params, hdr, named=False), f.name))
    w("        })")
    w("    }")
    w("}")
    w("")
    w("#[allow(unused)]")
    w("fn _use_types(_: c_int, _: c_uint, _: *const c_char) {}")
    return "\n".join(o) + "\n"


# ----------------------------------------------------------------------------------------------
# Safe-method generation (shared analysis)
# ----------------------------------------------------------------------------------------------

# Functions whose safe wrappers are written by hand in both languages (ownership or nullability
# that the regular shape cannot express), or which are not methods at all.
HAND_WRITTEN = {
    "flame_tensor_retain", "flame_tensor_release", "flame_tensor_context", "flame_tensor_shape",
    "flame_tensor_strides", "flame_tensor_grad", "flame_tensor_set_grad", "flame_backward",
    "flame_grad", "flame_tensor_register_hook", "flame_tensor_register_post_accumulate_grad_hook",
    "flame_hook_remove", "flame_ctx_destroy", "flame_ctx_create", "flame_ctx_options_init",
    "flame_ctx_device_name", "flame_ctx_memory_stats", "flame_ctx_counters", "flame_from_host", "flame_to_host",
    "flame_split", "flame_split_sizes", "flame_chunk", "flame_tensor_context",
    "flame_ctx_set_grad_enabled", "flame_ctx_set_inference_mode", "flame_tensor_data_ptr",
    "flame_ctx_stream", "flame_version_string", "flame_abi_version", "flame_status_string",
    "flame_last_error_message", "flame_set_error_message", "flame_dtype_size", "flame_dtype_name",
    "flame_device_count", "flame_tensor_to_dlpack", "flame_tensor_from_dlpack",
    "flame_tensor_to_dlpack_versioned", "flame_tensor_from_dlpack_versioned",
}

# Tensor parameters that flame.h documents as "may be NULL": Option<&Tensor> in Rust (C# passes null).
OPTIONAL_TENSORS = {
    ("flame_cross_entropy", "weight"), ("flame_nll_loss", "weight"),
    ("flame_binary_cross_entropy_with_logits", "weight"), ("flame_binary_cross_entropy_with_logits", "pos_weight"),
}

# safetensors: bindings/rust/src/safetensors.rs and the "safetensors" section of bindings/csharp/Flame.cs.
HAND_WRITTEN |= {
    "flame_safetensors_load", "flame_safetensors_release", "flame_safetensors_count", "flame_safetensors_name",
    "flame_safetensors_info", "flame_safetensors_get", "flame_safetensors_metadata_count",
    "flame_safetensors_metadata_key", "flame_safetensors_metadata", "flame_safetensors_save",
}

# optimizers: bindings/rust/src/optim.rs and the "optimizers" section of bindings/csharp/Flame.cs.
HAND_WRITTEN |= {
    "flame_optimizer_options_init", "flame_optimizer_create", "flame_optimizer_add_param_group",
    "flame_optimizer_step", "flame_optimizer_zero_grad", "flame_optimizer_set_lr", "flame_optimizer_get_lr",
    "flame_optimizer_step_count", "flame_optimizer_release",
}

# attention: bindings/rust/src/attention.rs and the "attention" section of bindings/csharp/Flame.cs.
HAND_WRITTEN |= {"flame_attention_options_init", "flame_scaled_dot_product_attention"}

# int32_t parameters named like flags: bool in the safe layers. Not "previous": set_autocast's
# previous value is a dtype (flame_ctx_set_grad_enabled's previous flag is wrapped by hand).
BOOL_NAMES = {"keepdim", "enabled", "requires_grad", "contiguous", "is_leaf"}
SCALARS = {"double", "float", "int32_t", "int64_t", "uint32_t", "uint64_t", "size_t", "int"}
SLICE_ELEMS = {"int64_t", "int32_t", "double", "float"}
COUNT_TYPES = {"int32_t", "int64_t", "size_t"}


class Arg:
    """kind: tensor | tensors | slice | scalar | bool | enum ; for outputs: out_tensor | out_scalar | out_bool | out_enum | out_ptr"""

    def __init__(self, kind, p, count=None):
        self.kind, self.p, self.count = kind, p, count


def analyse(f, hdr):
    """Returns (receiver, method name, inputs, outputs) or None when the function is not regular."""
    if f.name in HAND_WRITTEN or not f.ret.is_("flame_status_t"):
        return None
    ps = list(f.params)
    if not ps:
        return None
    p0 = ps[0]
    if p0.type.is_("flame_tensor_t"):
        recv, ps = "tensor", ps[1:]
        name = f.name[len("flame_"):]
        if name.startswith("tensor_"):
            name = name[len("tensor_"):]
    elif p0.type.is_("flame_ctx_t"):
        recv, ps = "ctx", ps[1:]
        name = f.name[len("flame_"):]
        if name.startswith("ctx_"):
            name = name[len("ctx_"):]
    elif p0.type.is_("flame_tensor_t", 1) and p0.type.base_const and len(ps) > 1 and ps[1].type.base in COUNT_TYPES and ps[1].type.depth == 0:
        recv, name = "static", f.name[len("flame_"):]
    else:
        return None
    # trailing outputs
    outs = []
    while ps:
        p = ps[-1]
        t = p.type
        if t.depth == 1 and not t.base_const:
            pt = t.base
            if pt == "flame_tensor_t":
                outs.insert(0, Arg("out_tensor", p))
            elif pt in SCALARS:
                outs.insert(0, Arg("out_bool" if p.name in BOOL_NAMES and pt == "int32_t" else "out_scalar", p))
            elif hdr.typedef_kind(pt) == "enum":
                outs.insert(0, Arg("out_enum", p))
            else:
                return None
            ps.pop()
        elif t.is_("void", 2):
            outs.insert(0, Arg("out_ptr", p))
            ps.pop()
        else:
            break
    if len([o for o in outs if o.kind == "out_tensor"]) > 1:
        return None
    ins = []
    i = 0
    while i < len(ps):
        p, t = ps[i], ps[i].type
        nxt = ps[i + 1] if i + 1 < len(ps) else None
        if t.is_("flame_tensor_t"):
            ins.append(Arg("opt_tensor" if (f.name, p.name) in OPTIONAL_TENSORS else "tensor", p))
        elif t.depth == 1 and t.base_const and nxt is not None and nxt.type.depth == 0 and nxt.type.base in COUNT_TYPES and \
                (t.base in SLICE_ELEMS or t.base == "flame_tensor_t"):
            ins.append(Arg("tensors" if t.base == "flame_tensor_t" else "slice", p, nxt))
            i += 1
        elif t.depth == 0 and t.base in SCALARS:
            ins.append(Arg("bool" if p.name in BOOL_NAMES and t.base == "int32_t" else "scalar", p))
        elif t.depth == 0 and hdr.typedef_kind(t.base) == "enum":
            ins.append(Arg("enum", p))
        else:
            return None
        i += 1
    return recv, name, ins, outs


# ----------------------------------------------------------------------------------------------
# Rust safe ops
# ----------------------------------------------------------------------------------------------

# int32_t parameters documented as holding a C enum's value: the Rust enum in the signature (as C#).
RS_INT_ENUMS = {("flame_linear", "activation"): "flame_activation_t", ("flame_pad", "mode"): "flame_pad_mode_t"}
# Functions wrapped by hand in Rust only (bindings/rust/src/toolkit.rs): autocast takes and returns
# Option<DType> (None for FLAME_AUTOCAST_OFF) instead of a raw int32_t.
# int32_t parameters that flame.h documents as 0 or 1: bool in Rust (C# keeps int).
RS_BOOL_PARAMS = {"training", "align_corners", "error_if_nonfinite", "channels_last", "approximate"}
RS_HAND_WRITTEN = {"flame_ctx_set_autocast", "flame_ctx_get_autocast"}
# Enums that stay the sys newtype in the safe layer: statuses are an open set (a newer library may
# return one these bindings do not know, and Status::LOAD_FAILED is the bindings' own).
RS_NEWTYPE_ENUMS = {"flame_status_t"}


def gen_rust_enums(hdr, w):
    """Idiomatic Rust enums (OptimizerKind::AdamW) for the safe layer, with checked conversion from
    the raw value; member names are those of the C# enums."""
    from gen_bindings_csharp import cs_enum_members
    for e in hdr.enums:
        if e.name is None or e.name in RS_NEWTYPE_ENUMS:
            continue
        wn = enum_wrapper_name(e.name)
        members = cs_enum_members(e)
        w("/// `%s`. Convert raw values with `%s::try_from` (an unknown value is an error)." % (e.name, wn))
        w("#[repr(i32)]")
        w("#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]")
        w("pub enum %s {" % wn)
        for m, v, n in members:
            w("    /// `%s`" % n)
            w("    %s = %d," % (m, v))
        w("}")
        w("impl %s {" % wn)
        w("    /// Every value, in header order.")
        w("    pub const ALL: &'static [%s] = &[%s];" % (wn, ", ".join("%s::%s" % (wn, m) for m, _, _ in members)))
        w("    /// The C value.")
        w("    pub fn raw(self) -> sys::%s {" % e.name)
        w("        self as sys::%s" % e.name)
        w("    }")
        w("    /// The C name (\"%s\")." % members[0][2])
        w("    pub fn c_name(self) -> &'static str {")
        w("        match self {")
        for m, _, n in members:
            w('            %s::%s => "%s",' % (wn, m, n))
        w("        }")
        w("    }")
        w("}")
        w("impl TryFrom<i32> for %s {" % wn)
        w("    type Error = Error;")
        w("    /// `ERROR_INVALID_ARGUMENT` for a value this header does not define.")
        w("    fn try_from(v: i32) -> Result<%s> {" % wn)
        w("        match v {")
        for m, v, _ in members:
            w("            %d => Ok(%s::%s)," % (v, wn, m))
        w('            _ => Err(Error::new(Status::ERROR_INVALID_ARGUMENT, format!("%s: unknown value {}", v))),' % e.name)
        w("        }")
        w("    }")
        w("}")
        w("")


def gen_rust_ops(hdr):
    o = []
    w = o.append
    enum_names = {e.name: enum_wrapper_name(e.name) for e in hdr.enums if e.name}
    w("// @generated by scripts/gen_bindings.py from include/flame.h. DO NOT EDIT.")
    w("// Safe methods for every function of regular shape; the rest are written by hand in lib.rs.")
    w("#![allow(clippy::too_many_arguments, unused_mut, unused_unsafe)]")
    w("")
    w("use crate::sys;")
    w("use crate::{api, check, len_as, slice_ptr, Context, Error, Result, Status, Tensor};")
    w("")
    gen_rust_enums(hdr, w)
    from gen_bindings_csharp import nullable_tensors  # the "may be NULL" analysis of flame.h's comments
    nullable = nullable_tensors(hdr)
    groups = {"tensor": [], "ctx": [], "static": []}
    skipped = []
    for f in hdr.funcs:
        a = None if f.name in RS_HAND_WRITTEN else analyse(f, hdr)
        if a is None:
            if f.name not in HAND_WRITTEN:
                skipped.append(f.name)
            continue
        groups[a[0]].append((f, a))

    def method(f, a):
        recv, name, ins, outs = a
        sig, call, pre = [], [], []
        if recv == "tensor":
            sig.append("&self")
            call.append("self.raw")
        elif recv == "ctx":
            sig.append("&self")
            call.append("self.raw")
        for arg in ins:
            pn = rs_ident(arg.p.name)
            t = arg.p.type
            if arg.kind == "tensor" and (f.name, arg.p.name) not in nullable:
                sig.append("%s: &Tensor" % pn)
                call.append("%s.raw" % pn)
            elif arg.kind in ("tensor", "opt_tensor"):  # documented "may be NULL": None passes NULL
                sig.append("%s: Option<&Tensor>" % pn)
                call.append("%s.map_or(std::ptr::null_mut(), |t| t.raw)" % pn)
            elif arg.kind == "tensors":
                sig.append("%s: &[&Tensor]" % pn)
                pre.append("let %s_raw: Vec<sys::flame_tensor_t> = %s.iter().map(|t| t.raw).collect();" % (arg.p.name, pn))
                call.append("slice_ptr(&%s_raw)" % arg.p.name)
                call.append("len_as::<%s>(%s.len())?" % (rs_type(arg.count.type, hdr), pn))
            elif arg.kind == "slice":
                sig.append("%s: &[%s]" % (pn, RS_PRIM[t.base]))
                call.append("slice_ptr(%s)" % pn)
                call.append("len_as::<%s>(%s.len())?" % (rs_type(arg.count.type, hdr), pn))
            elif arg.kind == "bool" or (arg.kind == "scalar" and arg.p.name in RS_BOOL_PARAMS and t.base == "int32_t"):
                sig.append("%s: bool" % pn)
                call.append("%s as i32" % pn)
            elif arg.kind == "enum":
                sig.append("%s: %s" % (pn, enum_names[t.base]))
                call.append("%s.raw()" % pn)
            elif (f.name, arg.p.name) in RS_INT_ENUMS:  # an int32_t that holds an enum's value
                sig.append("%s: %s" % (pn, enum_wrapper_name(RS_INT_ENUMS[(f.name, arg.p.name)])))
                call.append("%s.raw()" % pn)
            else:
                sig.append("%s: %s" % (pn, rs_type(t, hdr)))
                call.append(pn)
        rets, post = [], []
        for arg in outs:
            vn = "o_" + arg.p.name
            pt = arg.p.type.pointee()
            if arg.kind == "out_tensor":
                pre.append("let mut %s: sys::flame_tensor_t = std::ptr::null_mut();" % vn)
                rets.append(("Tensor", "unsafe { Tensor::from_raw(%s) }" % vn))
            elif arg.kind == "out_ptr":
                pre.append("let mut %s: *mut std::os::raw::c_void = std::ptr::null_mut();" % vn)
                rets.append(("*mut std::os::raw::c_void", vn))
            elif arg.kind == "out_bool":
                pre.append("let mut %s: i32 = 0;" % vn)
                rets.append(("bool", "%s != 0" % vn))
            elif arg.kind == "out_enum":
                pre.append("let mut %s: sys::%s = 0;" % (vn, pt.base))
                rets.append((enum_names[pt.base], "%s::try_from(%s)?" % (enum_names[pt.base], vn)))
            else:
                pre.append("let mut %s: %s = Default::default();" % (vn, rs_type(pt, hdr)))
                rets.append((rs_type(pt, hdr), vn))
            call.append("&mut %s" % vn)
        if not rets:
            rt, rv = "()", "()"
        elif len(rets) == 1:
            rt, rv = rets[0]
        else:
            rt = "(" + ", ".join(r[0] for r in rets) + ")"
            rv = "(" + ", ".join(r[1] for r in rets) + ")"
        doc = "/// `%s`." % f.decl.replace("FLAME_API ", "")
        lines = [doc, "pub fn %s(%s) -> Result<%s> {" % (rs_method(name), ", ".join(sig), rt)]
        lines.append("    let api = api()?;")
        for p in pre:
            lines.append("    " + p)
        lines.append("    check(unsafe { (api.%s)(%s) })?;" % (f.name, ", ".join(call)))
        lines.append("    Ok(%s)" % rv)
        lines.append("}")
        return lines

    for recv, ty in (("tensor", "Tensor"), ("static", "Tensor"), ("ctx", "Context")):
        if not groups[recv]:
            continue
        w("impl %s {" % ty)
        for f, a in groups[recv]:
            for ln in method(f, a):
                w("    " + ln if ln else "")
        w("}")
        w("")
    # skipped: wrapped by hand in toolkit.rs (HAND_WRAPPED); the coverage test finds any that is not.
    ty_of = {"tensor": "Tensor", "static": "Tensor", "ctx": "Context"}
    w("/// (export, safe wrapper) for every function with a generated method; the hand-written ones")
    w("/// are in `toolkit::HAND_WRAPPED`. The coverage test checks both against `sys::SYMBOLS`.")
    w("pub const WRAPPED: &[(&str, &str)] = &[")
    for recv in ("tensor", "static", "ctx"):
        for f, a in groups[recv]:
            w('    ("%s", "%s::%s"),' % (f.name, ty_of[recv], rs_method(a[1])))
    w("];")
    return "\n".join(o) + "\n"


# ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--header", default=os.path.join(ROOT, "include", "flame.h"))
    ap.add_argument("--out-root", default=ROOT, help="repository root to write into")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    sys.modules.setdefault("gen_bindings", sys.modules[__name__])  # the C# emitter imports this module
    from gen_bindings_csharp import gen_cs_native, gen_cs_ops
    try:
        hdr = parse_header(args.header)
        outputs = {
            "bindings/rust/src/sys.rs": gen_rust_sys(hdr),
            "bindings/rust/src/ops.rs": gen_rust_ops(hdr),
            "bindings/csharp/Native.g.cs": gen_cs_native(hdr),
            "bindings/csharp/Ops.g.cs": gen_cs_ops(hdr),
        }
    except ParseError as e:
        print("gen_bindings.py: error: %s" % e, file=sys.stderr)
        return 2
    stale = []
    for rel, text in outputs.items():
        path = os.path.join(args.out_root, rel)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old == text:
            continue
        if args.check:
            stale.append(rel)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        print("wrote %s" % rel)
    if stale:
        print("gen_bindings.py: stale generated files (run scripts/gen_bindings.py): %s" % ", ".join(stale), file=sys.stderr)
        return 1
    print("%d functions, %d enums, %d structs, %d callback types, %d handles, %d foreign structs, %d constants" % (
        len(hdr.funcs), len([e for e in hdr.enums if e.name]), len(hdr.structs), len(hdr.fnptrs),
        len(hdr.handles), len(hdr.opaque), len(hdr.defines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
