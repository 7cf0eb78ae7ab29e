#!/usr/bin/env python3
"""The C# emitter of scripts/gen_bindings.py: bindings/csharp/Native.g.cs (DllImport declarations,
enums, structs, delegates, constants) and bindings/csharp/Ops.g.cs (safe methods for every function
of regular shape). The parser, the model and the shared shape analysis live in gen_bindings.py, which
calls gen_cs_native and gen_cs_ops; this file holds only what is specific to C#.
"""
import os
import re
import sys

from gen_bindings import (ROOT, CType, ParseError, analyse, camel, cs_ident)


def xml(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def doc(summary):
    """One-line XML doc comment (every public member has one: mcs -doc with CS1591 as an error)."""
    return "/// <summary>%s</summary>" % summary


def c_decl(f):
    return "<c>%s</c>" % xml(f.decl.replace("FLAME_API ", ""))


# ---- idiomatic enums (namespace Flame), mapped from the C enums of Native.g.cs ----
CS_ENUM_NAMES = {"flame_status_t": "StatusCode", "flame_dtype_t": "DType"}
CS_ENUM_STRIP = {"flame_status_t": "ERROR_"}      # StatusCode.InvalidArgument, StatusCode.Ok
CS_ENUM_WORDS = {"ADAMW": "AdamW"}


def cs_enum_name(cname):
    if cname in CS_ENUM_NAMES:
        return CS_ENUM_NAMES[cname]
    n = cname[len("flame_"):] if cname.startswith("flame_") else cname
    return camel(n[:-2] if n.endswith("_t") else n)


def cs_enum_members(e):
    """(C# member name, value, C name) per entry: the common prefix (up to an underscore) dropped,
    words capitalized, words with digits kept upper (F32, BF16)."""
    names = [n for n, _ in e.entries]
    pre = os.path.commonprefix(names) if len(names) > 1 else names[0]
    pre = pre[:pre.rfind("_") + 1]
    out = []
    for n, v in e.entries:
        rest = n[len(pre):]
        strip = CS_ENUM_STRIP.get(e.name)
        if strip and rest.startswith(strip):
            rest = rest[len(strip):]
        words = [CS_ENUM_WORDS.get(w, w if any(c.isdigit() for c in w) else w.capitalize()) for w in rest.split("_") if w]
        m = "".join(words)
        if not m or m[0].isdigit():
            m = "V" + m
        out.append((m, v, n))
    return out


# Functions written by hand in bindings/csharp (Flame.cs, Toolkit.cs): never generated here, even if
# the shared analysis learns their shape. Their wrappers carry [Wraps("flame_...")] attributes; the
# coverage test (Tests.cs CpuCoverage) fails for any export without one.
CS_HAND_WRITTEN = {
    "flame_conv2d", "flame_conv_transpose2d", "flame_conv1d", "flame_max_pool2d", "flame_avg_pool2d",
    "flame_rope", "flame_optimizer_save_state", "flame_optimizer_load_state", "flame_grad_stats_host",
    "flame_grad_scaler_create", "flame_grad_scaler_release", "flame_grad_scaler_scale", "flame_grad_scaler_unscale",
    "flame_grad_scaler_unscale_tensors", "flame_grad_scaler_step", "flame_grad_scaler_update",
    "flame_grad_scaler_get_scale", "flame_grad_scaler_found_inf", "flame_grad_scaler_get_state",
    "flame_grad_scaler_set_state", "flame_lora_create", "flame_lora_release", "flame_lora_forward",
    "flame_lora_adapters", "flame_lora_merge", "flame_lora_unmerge", "flame_lora_is_merged", "flame_checkpoint",
    "flame_graph_capture_begin", "flame_graph_capture_end", "flame_graph_replay", "flame_graph_release",
    "flame_graph_capture_begin_shared",
    "flame_copy_from_host", "flame_comm_unique_id", "flame_comm_rendezvous", "flame_comm_create", "flame_comm_create_group",
    "flame_comm_env_local_rank", "flame_comm_create_from_env", "flame_zero_create", "flame_zero_step",
    "flame_zero_release", "flame_optimizer_state_bytes", "flame_zero_save_full", "flame_zero_save_shards",
    "flame_zero_load",
    "flame_comm_release", "flame_comm_rank", "flame_comm_size", "flame_comm_synchronize", "flame_comm_all_reduce",
    "flame_comm_broadcast", "flame_comm_all_gather", "flame_comm_reduce_scatter", "flame_dp_create",
    "flame_dp_set_sync", "flame_dp_wait", "flame_dp_release", "flame_fused_compile", "flame_fused_call",
    "flame_fused_release",
}

# Options structs with a hand-written class (Flame.cs); every other `*_options_t` with struct_size gets a
# generated class whose constructor calls its `*_options_init`.
CS_HAND_OPTIONS = {"flame_ctx_options_t", "flame_optimizer_options_t", "flame_attention_options_t"}
# int32_t option fields that are flags (0 / 1): bool properties.
CS_BOOL_FIELDS = {"padding_same", "ceil_mode", "count_include_pad", "interleaved", "enabled", "broadcast_parameters",
                  "allow_tf32", "gemm_heuristic_only", "nesterov", "amsgrad", "maximize", "master_weights",
                  "stochastic_rounding"}
# int32_t parameters documented as holding a C enum's value: the C# enum in the signature.
CS_INT_ENUMS = {("flame_linear", "activation"): "flame_activation_t", ("flame_pad", "mode"): "flame_pad_mode_t"}
# int32_t outputs whose name suggests a flag but which hold a value (autocast's previous dtype).
CS_NOT_BOOL = {("flame_ctx_set_autocast", "previous")}
CS_ARG_KINDS = {"tensor", "opt_tensor", "tensors", "slice", "bool", "enum", "scalar"}
CS_OUT_KINDS = {"out_tensor", "out_ptr", "out_bool", "out_enum", "out_scalar"}

# ----------------------------------------------------------------------------------------------
# C# raw layer
# ----------------------------------------------------------------------------------------------

CS_PRIM = {"void": "void", "char": "byte", "int": "int", "unsigned": "uint", "unsigned int": "uint",
           "float": "float", "double": "double", "size_t": "UIntPtr", "int8_t": "sbyte",
           "uint8_t": "byte", "int16_t": "short", "uint16_t": "ushort", "int32_t": "int",
           "uint32_t": "uint", "int64_t": "long", "uint64_t": "ulong", "intptr_t": "IntPtr",
           "uintptr_t": "UIntPtr", "ptrdiff_t": "IntPtr"}


def cs_type(t, hdr, ctx):
    """ctx: 'param', 'ret', 'field'."""
    kind = hdr.typedef_kind(t.base)
    if kind in ("handle", "fnptr") and t.depth == 0:
        if kind == "fnptr" and ctx == "param":
            return t.base  # delegate, marshalled as a function pointer
        return "IntPtr"
    if t.depth == 0:
        return CS_PRIM.get(t.base, t.base)
    if t.base == "char" and t.depth == 1:
        if ctx == "param" and t.base_const:
            return "string"  # input string (marshalled as a NUL-terminated UTF-8/ANSI copy)
        if ctx == "param":
            return "byte*"
        return "IntPtr"  # returned strings are owned by the library: Marshal.PtrToStringAnsi
    if ctx == "field":
        return "IntPtr"
    if kind == "opaque":
        return "IntPtr" + "*" * (t.depth - 1)  # a pointer to a foreign struct is an IntPtr
    if t.base == "void" and t.depth == 1:
        return "IntPtr"
    if kind in ("handle", "fnptr"):
        return "IntPtr" + "*" * t.depth  # the handle itself is already a pointer
    if t.base == "void":
        return "IntPtr" + "*" * (t.depth - 1)
    return CS_PRIM.get(t.base, t.base) + "*" * t.depth


def cs_params(params, hdr):
    return ", ".join("%s %s" % (cs_type(p.type, hdr, "param"), cs_ident(p.name)) for p in params)


def gen_cs_native(hdr):
    o = []
    w = o.append
    w("// <auto-generated>")
    w("// Generated by scripts/gen_bindings.py from include/flame.h. DO NOT EDIT.")
    w("// Regenerate with `python3 scripts/gen_bindings.py`; CI fails when this file is stale.")
    w("// </auto-generated>")
    w("using System;")
    w("using System.Runtime.InteropServices;")
    w("")
    w("namespace Flame.Interop")
    w("{")
    for e in hdr.enums:
        if e.name is None:
            continue
        w("    " + doc("<c>%s</c> (the safe layer uses <see cref=\"Flame.%s\"/>)." % (e.name, cs_enum_name(e.name))))
        w("    public enum %s : int" % e.name)
        w("    {")
        for n, v in e.entries:
            w("        " + doc("<c>%s</c>" % n))
            w("        %s = %d," % (n, v))
        w("    }")
        w("")
    for st in hdr.structs:
        w("    " + doc("<c>%s</c>, laid out as in C." % st.name))
        w("    [StructLayout(LayoutKind.Sequential)]")
        w("    public unsafe struct %s" % st.name)
        w("    {")
        for f in st.fields:
            w("        " + doc("<c>%s</c>" % xml(f.type.c() + " " + f.name + ("[%d]" % f.type.array if f.type.array is not None else ""))))
            t = cs_type(CType(f.type.base, f.type.base_const, f.type.ptr_consts), hdr, "field")
            if f.type.array is not None:
                if f.type.depth or t not in ("byte", "sbyte", "short", "ushort", "int", "uint", "long", "ulong", "float", "double"):
                    raise ParseError("array field %s.%s of non-primitive type" % (st.name, f.name))
                w("        public fixed %s %s[%d];" % (t, cs_ident(f.name), f.type.array))
            else:
                w("        public %s %s;" % (t, cs_ident(f.name)))
        w("    }")
        w("")
    for fp in hdr.fnptrs:
        w("    " + doc("The C callback type <c>%s</c>." % fp.name))
        w("    [UnmanagedFunctionPointer(CallingConvention.Cdecl)]")
        w("    public unsafe delegate %s %s(%s);" % (cs_type(fp.ret, hdr, "ret"), fp.name,
                                                  ", ".join("%s %s" % (cs_type(p.type, hdr, "field" if hdr.typedef_kind(p.type.base) == "fnptr" else "param"), cs_ident(p.name)) for p in fp.params)))
        w("")
    w("    " + doc("The raw P/Invoke declarations of every exported function, in header order."))
    w("    public static unsafe partial class Native")
    w("    {")
    w('        /// <summary>Library name for DllImport; Mono maps it with Flame.dll.config (dllmap to libflame.so.1).</summary>')
    w('        public const string Lib = "flame";')
    w("")
    for n, v in hdr.defines:
        w("        " + doc("<c>#define %s %d</c>" % (n, v)))
        w("        public const %s %s = %d;" % ("int" if -2**31 <= v < 2**31 else "long", n, v))
    for e in hdr.enums:
        if e.name is None:
            ty = "uint" if all(v >= 0 for _, v in e.entries) else "int"
            for n, v in e.entries:
                w("        " + doc("<c>%s</c>" % n))
                w("        public const %s %s = %d;" % (ty, n, v))
    w("")
    w("        /// <summary>Every exported function, in header order.</summary>")
    w("        public static readonly string[] Symbols = {")
    for f in hdr.funcs:
        w('            "%s",' % f.name)
    w("        };")
    w("")
    for f in hdr.funcs:
        w("        " + doc(c_decl(f)))
        w("        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl, EntryPoint = \"%s\", ExactSpelling = true)]" % f.name)
        w("        public static extern %s %s(%s);" % (cs_type(f.ret, hdr, "ret"), f.name, cs_params(f.params, hdr)))
        w("")
    w("    }")
    w("}")
    return "\n".join(o) + "\n"



# ----------------------------------------------------------------------------------------------
# C# safe ops
# ----------------------------------------------------------------------------------------------

def header_path():
    """The header gen_bindings.py parses (its --header option, else include/flame.h)."""
    for i, a in enumerate(sys.argv):
        if a == "--header" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--header="):
            return a[len("--header="):]
    return os.path.join(ROOT, "include", "flame.h")


IDENT = re.compile(r"[A-Za-z_]\w*")


def nullable_tensors(hdr):
    """{(function, parameter)} for tensor parameters that the comments above a declaration call
    nullable: "<p> may be NULL", "<p> [C] (borrowed; may be NULL)", "weight and bias ...; each may be
    NULL", "a and b are both given or both NULL". Only documentation follows from it (and a `= null`
    default for trailing ones): C# passes null as NULL for every tensor argument anyway."""
    text = open(header_path(), encoding="utf-8").read()
    found = set()
    prev_end = 0
    for f in hdr.funcs:
        m = re.search(r"FLAME_API[^;]*?\b%s\s*\(" % re.escape(f.name), text[prev_end:])
        if not m:
            continue
        start = prev_end + m.start()
        before = text[prev_end:start]
        prev_end = text.index(";", start) + 1
        comment = " ".join(" ".join(re.findall(r"/\*(.*?)\*/", before, re.S)).replace("*", " ").split())
        tensors = {p.name for p in f.params if p.type.is_("flame_tensor_t")}
        for m2 in re.finditer(r"(may be|both) NULL", comment):
            head = comment[:m2.start()]
            sentence = head[max(head.rfind(". "), 0):]
            depth, open_at = 0, -1
            for i in range(len(sentence) - 1, -1, -1):  # innermost unclosed '(' of the sentence
                if sentence[i] == ")":
                    depth += 1
                elif sentence[i] == "(":
                    if depth == 0:
                        open_at = i
                        break
                    depth -= 1
            clause = sentence[open_at + 1:] if open_at >= 0 else sentence
            clause = clause[clause.rfind(";") + 1:]
            names = [n for n in IDENT.findall(clause) if n in tensors]
            if not names and open_at >= 0:
                outer = re.sub(r"\[[^\]]*\]", "", sentence[:open_at]).rstrip()
                outer = outer[outer.rfind(";") + 1:]
                if re.search(r"\beach\b|\bboth\b", clause):
                    names = [n for n in IDENT.findall(outer) if n in tensors]
                else:
                    last = IDENT.findall(outer)
                    names = [last[-1]] if last and last[-1] in tensors else []
            elif not names and re.search(r"\beach\b|\bboth\b", clause):
                prev = sentence[:len(sentence) - len(clause)].rstrip("; ")
                prev = prev[prev.rfind(";") + 1:]
                names = [n for n in IDENT.findall(prev) if n in tensors]
            for n in names:
                found.add((f.name, n))
    return found


def gen_cs_enums(hdr, w):
    for e in hdr.enums:
        if e.name is None:
            continue
        w("    " + doc("<c>%s</c> with C# names; the values are the C values." % e.name))
        w("    public enum %s" % cs_enum_name(e.name))
        w("    {")
        for m, v, n in cs_enum_members(e):
            w("        " + doc("<c>%s</c>" % n))
            w("        %s = %d," % (m, v))
        w("    }")
        w("")


def options_init(hdr, st):
    """The `*_init` function whose first parameter is a pointer to st, or None."""
    for f in hdr.funcs:
        if f.name.endswith("_init") and f.params and f.params[0].type.is_(st.name, 1) and not f.params[0].type.base_const:
            return f
    return None


def gen_cs_options(hdr, w):
    """A class per options struct (struct_size first, an `*_init` function): the constructor takes the
    init function's other parameters and calls it; each field is a property (fixed arrays as copies of
    long[] etc., flag fields as bool); Raw is a copy of the C struct."""
    for st in hdr.structs:
        if st.name in CS_HAND_OPTIONS or not st.name.endswith("_options_t") or not st.fields or \
                st.fields[0].name != "struct_size":
            continue
        init = options_init(hdr, st)
        if init is None:
            continue
        cname = cs_enum_name(st.name)
        extra = init.params[1:]
        sig = ", ".join("%s %s" % (cs_type(p.type, hdr, "param"), cs_ident(p.name)) for p in extra)
        args = "".join(", " + cs_ident(p.name) for p in extra)
        w("    " + doc("Options <c>%s</c>, starting from the defaults of <c>%s</c>; pass it to the functions that take it." % (st.name, init.name)))
        w("    public sealed class %s" % cname)
        w("    {")
        w("        internal %s O;" % st.name)
        w("")
        w("        " + doc("The defaults (%s)." % c_decl(init)))
        w('        [Wraps("%s")]' % init.name)
        w("        public %s(%s)" % (cname, sig))
        w("        {")
        w("            Library.EnsureLoaded();")
        w("            O = Init(%s);" % args[2:])
        w("        }")
        w("")
        w("        [MethodImpl(MethodImplOptions.NoInlining)]")
        w("        static unsafe %s Init(%s)" % (st.name, sig))
        w("        {")
        w("            %s o;" % st.name)
        w("            Status.Check(Native.%s(&o%s));" % (init.name, args))
        w("            return o;")
        w("        }")
        w("")
        w("        " + doc("A copy of the C struct (struct_size set by <c>%s</c>)." % init.name))
        w("        public %s Raw { get { return O; } }" % st.name)
        for f in st.fields[1:]:
            t = f.type
            prop = camel(f.name)
            fdoc = doc("<c>%s</c>" % xml(t.c() + " " + f.name + ("[%d]" % t.array if t.array is not None else "")))
            if t.depth or hdr.typedef_kind(t.base) in ("fnptr", "handle", "struct"):
                continue  # pointers and callbacks: set them on a copy of Raw (ownership is the caller's)
            et = cs_type(CType(t.base), hdr, "field")
            if hdr.typedef_kind(t.base) == "enum":
                w("        " + fdoc)
                w("        public %s %s { get { return (%s)O.%s; } set { O.%s = (%s)value; } }" % (
                    cs_enum_name(t.base), prop, cs_enum_name(t.base), f.name, f.name, t.base))
            elif t.array is not None:
                w("        " + fdoc + "")
                w("        public unsafe %s[] %s" % (et, prop))
                w("        {")
                w("            get { var r = new %s[%d]; fixed (%s* p = O.%s) for (int i = 0; i < r.Length; i++) r[i] = p[i]; return r; }" % (
                    et, t.array, et, cs_ident(f.name)))
                w("            set")
                w("            {")
                w("                if (value == null || value.Length != %d)" % t.array)
                w('                    throw new ArgumentException("%s needs %d values");' % (prop, t.array))
                w("                fixed (%s* p = O.%s) for (int i = 0; i < value.Length; i++) p[i] = value[i];" % (et, cs_ident(f.name)))
                w("            }")
                w("        }")
            elif f.name in CS_BOOL_FIELDS and t.base in ("int32_t", "int"):
                w("        " + fdoc)
                w("        public bool %s { get { return O.%s != 0; } set { O.%s = value ? 1 : 0; } }" % (prop, f.name, f.name))
            else:
                w("        " + fdoc)
                w("        public %s %s { get { return O.%s; } set { O.%s = value; } }" % (et, prop, cs_ident(f.name), cs_ident(f.name)))
        w("    }")
        w("")


def gen_cs_ops(hdr):
    o = []
    w = o.append
    w("// <auto-generated>")
    w("// Generated by scripts/gen_bindings.py from include/flame.h. DO NOT EDIT.")
    w("// Safe methods for every function of regular shape, the idiomatic enums and the options classes;")
    w("// the rest is written by hand in Flame.cs and Toolkit.cs.")
    w("// </auto-generated>")
    w("using System;")
    w("using System.Runtime.CompilerServices;")
    w("using Flame.Interop;")
    w("")
    w("namespace Flame")
    w("{")
    gen_cs_enums(hdr, w)
    gen_cs_options(hdr, w)
    nullable = nullable_tensors(hdr)
    groups = {"tensor": [], "ctx": [], "static": []}
    for f in hdr.funcs:
        if f.name in CS_HAND_WRITTEN:
            continue
        a = analyse(f, hdr)
        if a is not None and all(x.kind in CS_ARG_KINDS for x in a[2]) and all(x.kind in CS_OUT_KINDS for x in a[3]):
            groups[a[0]].append((f, a))

    def method(f, a, static_name=None):
        recv, name, ins, outs = a
        sig, call, pre = [], [], []
        keep = []
        if recv in ("tensor", "ctx"):
            call.append("Raw")
            keep.append("this")
        fixed = []
        pdocs = []
        for arg in ins:
            if arg.kind in ("tensor", "opt_tensor") and (arg.kind == "opt_tensor" or (f.name, arg.p.name) in nullable):
                pdocs.append((cs_ident(arg.p.name), "May be null (NULL in C).", True))
            else:
                pdocs.append((cs_ident(arg.p.name), "<c>%s</c>" % xml(arg.p.type.c() + " " + arg.p.name), False))
            pn = cs_ident(arg.p.name)
            t = arg.p.type
            if arg.kind in ("tensor", "opt_tensor"):  # null passes NULL
                sig.append("Tensor %s" % pn)
                call.append("Tensor.RawOf(%s)" % pn)
                keep.append(pn)
            elif arg.kind == "tensors":
                sig.append("Tensor[] %s" % pn)
                pre.append("IntPtr[] %s_raw = Tensor.RawArray(%s);" % (arg.p.name, pn))
                fixed.append("fixed (IntPtr* %s_p = %s_raw)" % (arg.p.name, arg.p.name))
                call.append("%s_p" % arg.p.name)
                call.append("(%s)%s_raw.Length" % (CS_PRIM[arg.count.type.base], arg.p.name) if arg.count.type.base != "size_t" else "(UIntPtr)%s_raw.Length" % arg.p.name)
                keep.append(pn)
            elif arg.kind == "slice":
                et = CS_PRIM[t.base]
                sig.append("%s[] %s" % (et, pn))
                pre.append("%s[] %s_a = %s ?? new %s[0];" % (et, arg.p.name, pn, et))
                fixed.append("fixed (%s* %s_p = %s_a)" % (et, arg.p.name, arg.p.name))
                call.append("(%s_a.Length == 0 ? null : %s_p)" % (arg.p.name, arg.p.name))
                call.append("(%s)%s_a.Length" % (CS_PRIM[arg.count.type.base], arg.p.name) if arg.count.type.base != "size_t" else "(UIntPtr)%s_a.Length" % arg.p.name)
            elif arg.kind == "bool":
                sig.append("bool %s" % pn)
                call.append("(%s ? 1 : 0)" % pn)
            elif arg.kind == "enum":
                sig.append("%s %s" % (cs_enum_name(t.base), pn))
                call.append("(%s)%s" % (t.base, pn))
            elif (f.name, arg.p.name) in CS_INT_ENUMS:  # an int32_t that holds an enum's value
                sig.append("%s %s" % (cs_enum_name(CS_INT_ENUMS[(f.name, arg.p.name)]), pn))
                call.append("(%s)%s" % (cs_type(t, hdr, "param"), pn))
            else:
                sig.append("%s %s" % (cs_type(t, hdr, "param"), pn))
                call.append(pn)
        rets = []
        for arg in outs:
            vn = "o_" + arg.p.name
            pt = arg.p.type.pointee()
            if arg.kind == "out_tensor":
                pre.append("IntPtr %s = IntPtr.Zero;" % vn)
                rets.append(("Tensor", "new Tensor(%s)" % vn))
            elif arg.kind == "out_ptr":
                pre.append("IntPtr %s = IntPtr.Zero;" % vn)
                rets.append(("IntPtr", vn))
            elif arg.kind == "out_bool" and (f.name, arg.p.name) not in CS_NOT_BOOL:
                pre.append("int %s = 0;" % vn)
                rets.append(("bool", "%s != 0" % vn))
            elif arg.kind == "out_enum":
                pre.append("%s %s = 0;" % (pt.base, vn))
                rets.append((cs_enum_name(pt.base), "(%s)%s" % (cs_enum_name(pt.base), vn)))
            else:
                ct = cs_type(pt, hdr, "ret")
                pre.append("%s %s = default(%s);" % (ct, vn, ct))
                rets.append((ct, vn))
            call.append("&%s" % vn)
        if not rets:
            rt, rv = "void", None
        elif len(rets) == 1:
            rt, rv = rets[0]
        else:
            rt = "Tuple<%s>" % ", ".join(r[0] for r in rets)
            rv = "Tuple.Create(%s)" % ", ".join(r[1] for r in rets)
        mname = camel(name)
        mods = "public static unsafe" if recv == "static" else "public unsafe"
        # trailing nullable tensors default to null
        for i in range(len(sig) - 1, -1, -1):
            if not pdocs[i][2]:
                break
            sig[i] += " = null"
        lines = [doc(c_decl(f))]
        if any(d[2] for d in pdocs):
            lines += ['/// <param name="%s">%s</param>' % (n.lstrip("@"), t) for n, t, _ in pdocs]
        lines += ['[Wraps("%s")]' % f.name, "%s %s %s(%s)" % (mods, rt, mname, ", ".join(sig)), "{"]
        for p in pre:
            lines.append("    " + p)
        ind = "    "
        for fx in fixed:
            lines.append(ind + fx)
        lines.append(ind + "{")
        lines.append(ind + "    Status.Check(Native.%s(%s));" % (f.name, ", ".join(call)))
        lines.append(ind + "}")
        for k in keep:
            lines.append("    GC.KeepAlive(%s);" % k)
        if rv is not None:
            lines.append("    return %s;" % rv)
        lines.append("}")
        return lines

    for recv, ty in (("tensor", "Tensor"), ("ctx", "Context")):
        w("    public sealed partial class %s" % ty)
        w("    {")
        items = groups[recv] + (groups["static"] if recv == "tensor" else [])
        for f, a in items:
            for ln in method(f, a):
                w("        " + ln)
            w("")
        w("    }")
        w("")
    w("}")
    return "\n".join(o) + "\n"
