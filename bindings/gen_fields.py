#!/usr/bin/env python3
"""Writes the per-language field lists of libdstransformer's configuration structs from the public header.

The header (capi/include/dstransformer/dstransformer.h) is the one source of truth for the fields of
`dst_layer_config` and `dst_checkpoint_options`: their names, C types, order, documentation and defaults
("Default X." in each field's comment). The table below adds only what the header cannot say: which
`int32_t` fields are booleans, the Python names of the DeepSpeed-style configuration, the fields that
exist only in Python (DeepSpeed's `batch_size`, `local_rank`, `fp16`, `return_tuple`) and the wording the
bindings use for the checkpoint options.

Generated code lives between marker lines in checked-in files:

    <comment> BEGIN GENERATED <name> (bindings/gen_fields.py from dstransformer.h; do not edit)
    ...
    <comment> END GENERATED <name>

    python3 bindings/gen_fields.py           rewrites every region (and the whole generated files)
    python3 bindings/gen_fields.py --check   exits 1, printing a diff, when a checked-in copy is stale

Standard library only; any Python 3.8 or newer.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "capi", "include", "dstransformer", "dstransformer.h")
ME = "bindings/gen_fields.py"

# ---- the table: what the header does not say --------------------------------------------------------

#: `int32_t` fields that are booleans (0 false, anything else true).
BOOLS = {
    "dst_layer_config": {"pre_layer_norm", "normalize_invertible", "gelu_checkpoint", "attn_dropout_checkpoint",
                         "adjust_init_range", "stochastic_mode", "training", "causal", "allow_tf32"},
    "dst_checkpoint_options": {"include_grads", "restore_rng"},
}
#: `int32_t` fields that are plain integers.
INTS = {
    "dst_layer_config": {"hidden_size", "heads", "intermediate_size", "num_hidden_layers", "max_seq_len"},
    "dst_checkpoint_options": set(),
}
#: Fields of the Python/DeepSpeed configuration that are named differently from the C field.
PY_NAMES = {"max_seq_len": "max_seq_length"}
#: Python defaults that differ from the C default (DeepSpeed's conventions; `None` = derived, see the doc).
PY_DEFAULTS = {"intermediate_size": -1, "dtype": None, "max_batch_tokens": None}
#: Bindings' wording where the header's speaks of C values (the default sentence is added).
BINDING_DOCS = {
    "pre_layer_norm": "Pre-LN (true) or Post-LN (false).",
    "training": "Initial mode: training (dropout, saved state) or inference.",
}
PY_DOC_OVERRIDES = {
    "intermediate_size": "FFN width I; ≤ 0 means 4·H (DeepSpeed's convention).",
    "seed": "Seed of the initial weights (Philox key); −1 means 2**64 − 1, as in DeepSpeed.",
    "dtype": ('Storage type: "fp32", "fp16", "bf16" or "fp64"; None: "fp16" when ``fp16``, else "fp32".'),
    "max_batch_tokens": ("Largest B·S of any call; None: ``batch_size · max_seq_length`` when ``batch_size`` "
                         "> 0, else the library's default (8192, raised to ``max_seq_length`` if smaller)."),
    "gelu": 'GELU form: "erf" (exact, Hugging Face BERT) or "tanh" (DeepSpeed\'s kernel).',
}


@dataclass
class PyOnly:
    name: str
    default: object
    doc: str
    replaced_by: str  # what stands for it in the C struct (docs/api.md says the same)


#: DeepSpeedTransformerConfig arguments that the C struct does not hold, and what replaces each.
PY_ONLY = [
    PyOnly("batch_size", -1, "DeepSpeed's batch size; only sizes the default ``max_batch_tokens``.",
           "`max_batch_tokens` (the largest B·S of a call); the B of each call is its input's"),
    PyOnly("local_rank", -1, "The PyTorch drop-in's device: ≥ 0 runs on ``cuda:local_rank`` (an error when no "
           "CUDA device is usable); −1 on the current CUDA device, else on the CPU.",
           "the context: `dst_context_create(DST_BACKEND_CUDA, local_rank, &ctx)`"),
    PyOnly("fp16", False, "Store parameters and activations in fp16 (same as ``dtype=\"fp16\"``).",
           "`dtype` (`DST_DTYPE_FP16`; also BF16, FP32, FP64)"),
    PyOnly("return_tuple", False, "Forward returns ``(output,)`` instead of ``output``.",
           "nothing: the C forward writes its output tensor; tuples are a Python matter"),
]
#: DeepSpeed's positional order of DeepSpeedTransformerConfig's arguments, and its defaults.
DS_ORDER = ["batch_size", "hidden_size", "intermediate_size", "heads", "attn_dropout_ratio",
            "hidden_dropout_ratio", "num_hidden_layers", "initializer_range", "layer_norm_eps", "local_rank",
            "seed", "fp16", "pre_layer_norm", "normalize_invertible", "gelu_checkpoint", "adjust_init_range",
            "attn_dropout_checkpoint", "stochastic_mode", "return_tuple", "training"]
DS_DEFAULTS = {"batch_size": -1, "hidden_size": -1, "intermediate_size": -1, "heads": -1,
               "attn_dropout_ratio": -1, "hidden_dropout_ratio": -1, "num_hidden_layers": -1,
               "initializer_range": -1, "layer_norm_eps": 1e-12, "local_rank": -1, "seed": -1, "fp16": False,
               "pre_layer_norm": True, "normalize_invertible": False, "gelu_checkpoint": False,
               "adjust_init_range": True, "attn_dropout_checkpoint": False, "stochastic_mode": False,
               "return_tuple": False, "training": True}
#: Sizes DeepSpeed leaves at −1 (no usable default): a layer needs them set.
DS_REQUIRED = ["hidden_size", "heads", "attn_dropout_ratio", "hidden_dropout_ratio", "initializer_range",
               "num_hidden_layers"]

#: The checkpoint options as the Java and Rust bindings present them: one field per option (`client_state`
#: with its `client_state_len` is one byte string), in the header's order, with language-neutral wording
#: ({none} is null / `None`; the defaults are the header's).
OPTION_KINDS = {"layout": "enum", "prefix": "opt_str", "include_grads": "bool", "save_dtype": "opt_dtype",
                "restore_rng": "bool", "client_state": "opt_bytes", "client_state_len": "len"}
OPTION_DOCS = {
    "layout": "Naming scheme. Default {default}.",
    "prefix": "Prepended to `layer.<i>.`; {none} for none. Loading a Hugging Face file also accepts the "
              "prefixes `bert.encoder.` and `encoder.` when this is {none}. Default {none}.",
    "include_grads": "Save: also write the gradients. Load: also read them (they must be present). "
                     "Default {default}.",
    "save_dtype": "Save: the dtype to convert to; {none} keeps each layer's dtype. Default {none}.",
    "restore_rng": "Load: set the first layer's context RNG state from the file. Default {default}.",
    "client_state": "Save: opaque bytes stored with the weights (epoch, step…), kept exactly (UTF-8 text "
                    "without NUL is stored as text, anything else base64-encoded). Default {none}.",
}
ENUM_LAYOUT = {"java": "WeightLayout", "rust": "WeightLayout", "rust_fallback": "DeepSpeed",
               "values": {"DST_LAYOUT_DEEPSPEED": ("DEEPSPEED", "DeepSpeed", "deepspeed"),
                          "DST_LAYOUT_HF_BERT": ("HF_BERT", "HfBert", "hf_bert")}}

#: Enum types: binding names per language, and how the header's default names map to them.
ENUMS = {
    "dst_weight_layout": ENUM_LAYOUT,
    "dst_dtype": {"java": "DType", "rust": "DType", "rust_fallback": "F32",
                  "values": {"FP32": ("FP32", "F32", "fp32"), "FP16": ("FP16", "F16", "fp16"),
                             "BF16": ("BF16", "BF16", "bf16"), "FP64": ("FP64", "F64", "fp64")}},
    "dst_gelu": {"java": "Gelu", "rust": "Gelu", "rust_fallback": "Erf",
                 "values": {"DST_GELU_ERF": ("ERF", "Erf", "erf"), "DST_GELU_TANH": ("TANH", "Tanh", "tanh")}},
}

# ---- the header ------------------------------------------------------------------------------------


@dataclass
class Field:
    ctype: str  # e.g. "int32_t", "const char *", "dst_tensor"
    name: str
    array: Optional[str]  # "DST_MAX_DIMS", "2" or None
    doc: str  # the comment, whitespace collapsed
    kind: str = ""  # int, bool, float, u64, i64, size, enum, str, ...
    default: Optional[str] = None  # the text after "Default " in the doc


@dataclass
class Struct:
    name: str
    fields: List[Field] = field(default_factory=list)

    def get(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)


_FIELD_RE = re.compile(
    r"((?:const\s+)?[A-Za-z_]\w*)\s*(\*?)\s*([A-Za-z_]\w*)\s*(?:\[(\w+)\])?\s*;\s*/\*\*<(.*?)\*/", re.S)
_DEFAULT_RE = re.compile(r"\bDefault:? (::\w+|[-\w.+]+?)(?=[.:](?:\s|$))")


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def parse_header(path: str = HEADER) -> Tuple[Dict[str, Struct], Dict[str, List[Tuple[str, int]]], Dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    structs: Dict[str, Struct] = {}
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} \1;", text, re.S):
        s = Struct(m.group(1))
        for fm in _FIELD_RE.finditer(m.group(2)):
            ctype = fm.group(1) + (" *" if fm.group(2) else "")
            doc = _collapse(fm.group(5))
            f = Field(ctype, fm.group(3), fm.group(4), doc)
            dm = _DEFAULT_RE.search(doc)
            f.default = dm.group(1) if dm else None
            s.fields.append(f)
        structs[s.name] = s
    enums: Dict[str, List[Tuple[str, int]]] = {}
    for m in re.finditer(r"typedef DST_ENUM\((\w+)\) \{(.*?)\} \1;", text, re.S):
        vals = re.findall(r"(DST_\w+)\s*=\s*(-?\d+)", m.group(2))
        enums[m.group(1)] = [(n, int(v)) for n, v in vals]
    defines = dict(re.findall(r"#define (DST_\w+) (\d+)\s", text))
    return structs, enums, defines


def classify(structs: Dict[str, Struct]) -> None:
    """Gives every field of the two configuration structs its kind; a field the table does not cover is
    an error that says what to add."""
    for sname in ("dst_layer_config", "dst_checkpoint_options"):
        for f in structs[sname].fields:
            if f.name == "struct_size":
                f.kind = "size"
            elif f.ctype == "int32_t":
                if f.name in BOOLS[sname]:
                    f.kind = "bool"
                elif f.name in INTS[sname]:
                    f.kind = "int"
                elif sname == "dst_checkpoint_options" and f.name == "save_dtype":
                    f.kind = "opt_dtype"
                else:
                    sys.exit(f"{ME}: {sname}.{f.name} is int32_t: add it to BOOLS or INTS")
            elif f.ctype == "float":
                f.kind = "float"
            elif f.ctype == "uint64_t":
                f.kind = "u64"
            elif f.ctype == "int64_t":
                f.kind = "i64"
            elif f.ctype == "size_t":
                f.kind = "size"
            elif f.ctype in ENUMS:
                f.kind = "enum"
            elif f.ctype == "const char *":
                f.kind = "str"
            else:
                sys.exit(f"{ME}: {sname}.{f.name} has type {f.ctype}, which the generator does not map")
            if sname == "dst_layer_config" and f.kind != "size" and f.default is None:
                sys.exit(f"{ME}: {sname}.{f.name}: its comment in the header needs a 'Default X.' sentence")


# ---- values in each language -------------------------------------------------------------------------


def java_default(f: Field) -> str:
    if f.kind == "bool":
        return "true" if f.default not in ("0",) else "false"
    if f.kind == "enum":
        e = ENUMS[f.ctype]
        return "{@link %s#%s}" % (e["java"], e["values"][f.default.lstrip(":")][0])
    return f.default


def rust_default(f: Field) -> str:
    if f.kind == "bool":
        return "true" if f.default != "0" else "false"
    if f.kind == "enum":
        e = ENUMS[f.ctype]
        return "[`%s::%s`]" % (e["rust"], e["values"][f.default.lstrip(":")][1])
    return f.default


def py_default_value(f: Field):
    """The Python value of a field's default, from the header's text."""
    if f.name in PY_DEFAULTS:
        return PY_DEFAULTS[f.name]
    d = f.default
    if f.kind == "bool":
        return d != "0"
    if f.kind == "enum":
        return ENUMS[f.ctype]["values"][d.lstrip(":")][2]
    if f.kind == "float":
        return float(d)
    return int(d)


def _doc_with_default(f: Field, value: str) -> str:
    doc = re.sub(r"(?<![\w:])::(?=\w)", "", binding_doc(f))  # Doxygen's ::name references
    if f.default is None:
        return doc
    return _DEFAULT_RE.sub(lambda m: "Default " + value, doc, count=1)


def _camel(name: str, upper_first: bool = False) -> str:
    parts = name.split("_")
    s = parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])
    return s[:1].upper() + s[1:] if upper_first else s


def _swig_accessor(name: str) -> str:
    return name[:1].upper() + name[1:]


def _wrap(text: str, width: int, first: str, rest: str) -> List[str]:
    """Greedy word wrap: the first line starts with `first`, the others with `rest` (both include any
    separating space)."""
    lines, cur, fresh = [], first, True
    for w in text.split():
        if not fresh and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur, fresh = rest, True
        cur += w if fresh else " " + w
        fresh = False
    lines.append(cur)
    return lines


def _py_str_lines(text: str, indent: str, width: int, tail: str = "") -> List[str]:
    """`text` as adjacent Python string literals, one per line, split between words."""
    chunks = _wrap(text, width - len(indent) - 4, "", "")
    out = [indent + repr(c + (" " if i < len(chunks) - 1 else "")) for i, c in enumerate(chunks)]
    out[-1] += tail
    return out


def binding_doc(f: Field) -> str:
    """A field's documentation for the bindings (the header's, unless it speaks of C values)."""
    d = BINDING_DOCS.get(f.name)
    if d is None:
        return f.doc
    return d + (" Default " + f.default + "." if f.default is not None else "")


# ---- generators ----------------------------------------------------------------------------------


def gen_rust_config(cfg: Struct) -> str:
    out = ["config_fields! {"]
    for f in cfg.fields:
        if f.kind == "size":
            continue
        doc = _doc_with_default(f, rust_default(f))
        out += _wrap(doc, 108, "    /// ", "    /// ")
        if f.kind == "bool":
            ty, conv = "bool", "|r| r != 0, |v| v as i32"
        elif f.kind == "enum":
            e = ENUMS[f.ctype]
            ty = e["rust"]
            conv = "|r| %s::from_raw(r).unwrap_or(%s::%s), |v| v.to_raw()" % (ty, ty, e["rust_fallback"])
        else:
            ty = {"int": "i32", "float": "f32", "u64": "u64", "i64": "i64"}[f.kind]
            conv = "|r| r, |v| v"
        out.append(f"    {f.name}: {ty} => {conv};")
    out.append("}")
    return "\n".join(out) + "\n"


_JAVA_TYPES = {"int": "int", "float": "float", "u64": "long", "i64": "long", "bool": "boolean"}


def _java_type(f: Field) -> str:
    return ENUMS[f.ctype]["java"] if f.kind == "enum" else _JAVA_TYPES[f.kind]


def gen_java_fields(cfg: Struct) -> str:
    return "".join(f"    private {_java_type(f)} {_camel(f.name)};\n" for f in cfg.fields if f.kind != "size")


def gen_java_load(cfg: Struct) -> str:
    out = []
    for f in cfg.fields:
        if f.kind == "size":
            continue
        get = f"raw.get{_swig_accessor(f.name)}()"
        if f.kind == "bool":
            get += " != 0"
        elif f.kind == "enum":
            get = f"{_java_type(f)}.fromRaw({get})"
        out.append(f"        {_camel(f.name)} = {get};")
    return "\n".join(out) + "\n"


def gen_java_to_native(cfg: Struct) -> str:
    out = []
    for f in cfg.fields:
        if f.kind == "size":
            continue
        v = _camel(f.name)
        if f.kind == "bool":
            v = f"{v} ? 1 : 0"
        elif f.kind == "enum":
            v = f"{v}.raw()"
        out.append(f"        raw.set{_swig_accessor(f.name)}({v});")
    return "\n".join(out) + "\n"


def gen_java_accessors(cfg: Struct) -> str:
    out = []
    fields = [f for f in cfg.fields if f.kind != "size"]
    for f in fields:
        jt, v, cap = _java_type(f), _camel(f.name), _camel(f.name, True)
        doc = _doc_with_default(f, java_default(f))
        doc = re.sub(r"`([^`]+)`", r"{@code \1}", doc)
        out += _java_doc(doc)
        out.append(f"    public {jt} get{cap}() {{")
        out.append(f"        return {v};")
        out.append("    }")
        out.append("")
        out.append("    /**")
        out.append(f"     * Sets {{@code {v}}} (see {{@link #get{cap}()}}).")
        out.append("     *")
        out.append("     * @return this configuration")
        out.append("     */")
        out.append(f"    public LayerConfig set{cap}({jt} value) {{")
        if f.kind == "enum":
            out.append(f"        this.{v} = java.util.Objects.requireNonNull(value, \"{v}\");")
        else:
            out.append(f"        this.{v} = value;")
        out.append("        return this;")
        out.append("    }")
        out.append("")
    names = [_camel(f.name) for f in fields]
    out.append("    @Override")
    out.append("    public boolean equals(Object other) {")
    out.append("        if (this == other) {")
    out.append("            return true;")
    out.append("        }")
    out.append("        if (!(other instanceof LayerConfig)) {")
    out.append("            return false;")
    out.append("        }")
    out.append("        LayerConfig o = (LayerConfig) other;")
    conds = []
    for f, n in zip(fields, names):
        if f.kind == "float":
            conds.append(f"Float.compare({n}, o.{n}) == 0")
        else:
            conds.append(f"{n} == o.{n}")
    out.append("        return " + conds[0])
    for c in conds[1:-1]:
        out.append(f"                && {c}")
    out.append(f"                && {conds[-1]};")
    out.append("    }")
    out.append("")
    out.append("    @Override")
    out.append("    public int hashCode() {")
    hl = _wrap(", ".join(names) + ");", 112, "        return java.util.Objects.hash(", "                ")
    out += hl
    out.append("    }")
    out.append("")
    out.append("    @Override")
    out.append("    public String toString() {")
    parts = [f'"{n}=" + {n}' for n in names]
    out.append(f'        return "LayerConfig[" + {parts[0]} + ", "')
    for p in parts[1:-1]:
        out.append(f'                + {p} + ", "')
    out.append(f'                + {parts[-1]} + "]";')
    out.append("    }")
    return "\n".join(out) + "\n"


def _py_literal(v) -> str:
    return repr(v)


def _py_hint(kind: str) -> str:
    return {"bool": "bool", "int": "int", "float": "float", "u64": "int", "i64": "int"}.get(kind, "Any")


def py_fields(cfg: Struct) -> List[Tuple[str, str, str, object, str]]:
    """(Python name, C name or "", kind, default, doc) of every LayerConfig field, in Python order:
    DeepSpeed's constructor arguments first (those the struct has, then the Python-only ones in their
    DeepSpeed place), then the library's own."""
    by_py = {}
    for f in cfg.fields:
        if f.kind == "size":
            continue
        py = PY_NAMES.get(f.name, f.name)
        kind = "dtype" if f.ctype == "dst_dtype" else ("gelu" if f.ctype == "dst_gelu" else f.kind)
        if f.name == "max_batch_tokens":
            kind = "i64"
        doc = PY_DOC_OVERRIDES.get(f.name) or re.sub(r"\s*Default:? .*$", "", binding_doc(f)).strip()
        by_py[py] = (py, f.name, kind, py_default_value(f), doc)
    for p in PY_ONLY:
        by_py[p.name] = (p.name, "", "bool" if isinstance(p.default, bool) else "int", p.default, p.doc)
    order = [n for n in DS_ORDER if n in by_py]
    order += [n for n in by_py if n not in order]
    return [by_py[n] for n in order]


def gen_py_fields_module(cfg: Struct, opts: Struct) -> str:
    out = ['"""The configuration fields of the C header, for the Python classes (``LayerConfig``,',
           "``TransformerConfig``) and their tests.",
           "",
           f"Generated by {ME} from capi/include/dstransformer/dstransformer.h; do not edit.",
           '"""', "",
           "#: (Python name, C field or \"\" for a Python-only field, kind, Python default, doc), in the order",
           "#: of ``LayerConfig``'s signature.",
           "LAYER_CONFIG_FIELDS = ("]
    for py, c, kind, default, doc in py_fields(cfg):
        out.append(f"    ({py!r}, {c!r}, {kind!r}, {_py_literal(default)},")
        out += _py_str_lines(doc, "     ", 108, "),")
    out.append(")")
    out.append("")
    out.append("#: C field -> its default as the header documents it (checked against dst_layer_config_default).")
    out.append("C_DEFAULTS = {")
    for f in cfg.fields:
        if f.kind != "size":
            out.append(f"    {f.name!r}: {_py_literal(_c_default_py(f))},")
    out.append("}")
    out.append("")
    out.append("#: DeepSpeedTransformerConfig's positional arguments, in order.")
    out += _wrap(repr(tuple(DS_ORDER)), 108, "DEEPSPEED_ORDER = ", "    ")
    out.append("#: Sizes DeepSpeed leaves at −1: a layer needs them set.")
    out += _wrap(repr(tuple(DS_REQUIRED)), 108, "DEEPSPEED_REQUIRED = ", "    ")
    out.append("#: Python-only DeepSpeed fields -> what stands for them in the C struct.")
    out.append("REPLACED_IN_C = {")
    for p in PY_ONLY:
        out.append(f"    {p.name!r}: {p.replaced_by!r},")
    out.append("}")
    out.append("#: Fields of dst_checkpoint_options, in order (the Python checkpoint functions' keywords map")
    out.append("#: onto them; tests check that every one is covered).")
    out += _wrap(repr(tuple(f.name for f in opts.fields if f.kind != "size")) + "", 108,
                 "CHECKPOINT_OPTIONS_FIELDS = ", "    ")
    return "\n".join(out) + "\n"


def _c_default_py(f: Field):
    """The C default (not the Python override) as a Python value."""
    d = f.default
    if f.kind == "enum":
        return ENUMS[f.ctype]["values"][d.lstrip(":")][2]
    if f.kind == "float":
        return float(d)
    if f.kind == "bool":
        return d != "0"
    return int(d)


def _py_signature(params: List[Tuple[str, str, object]], positional: int, indent: str, head: str) -> List[str]:
    """`def __init__(self, a: int = 1, ..., *, z: bool = False) -> None:` wrapped to 112 columns."""
    items = ["self"]
    for i, (name, hint, default) in enumerate(params):
        if i == positional:
            items.append("*")
        items.append(f"{name}: {hint} = {_py_literal(default)}")
    lines, cur = [], indent + head + "("
    for i, it in enumerate(items):
        piece = it + ("," if i < len(items) - 1 else ") -> None:")
        if len(cur) + len(piece) + 1 > 112:
            lines.append(cur.rstrip())
            cur = indent + "             "
        cur += ("" if cur.endswith("(") or cur.strip() == "" else " ") + piece
    lines.append(cur)
    return lines


def _py_hint_of(kind: str, default) -> str:
    if kind == "dtype":
        return "Optional[str]"
    if kind == "gelu":
        return "str"
    if default is None:
        return "Optional[int]"
    return _py_hint(kind)


def _py_docstring(summary: List[str], fields, indent: str) -> List[str]:
    out = [indent + '"""' + summary[0]] + [indent + s for s in summary[1:]]
    for py, _c, _kind, default, doc in fields:
        out += _wrap(f"{py}: {doc} Default {_py_literal(default)}.", 108, indent + "- ", indent + "  ")
    out.append(indent + '"""')
    return [l if l.strip() else "" for l in out]


def gen_py_layerconfig_init(cfg: Struct) -> str:
    fields = py_fields(cfg)
    params = [(py, _py_hint_of(kind, d), d) for py, _c, kind, d, _doc in fields]
    ind = "    "
    out = _py_signature(params, 0, ind, "def __init__")
    out += _py_docstring(["A configuration; every argument is a keyword (DeepSpeed's arguments and the library's",
                          "own). The defaults are the library's; the configuration is validated at once.", ""],
                         fields, ind * 2)
    out.append(ind * 2 + "self._assign(locals(), validate=True)")
    return "\n".join(out) + "\n"


def gen_py_transformerconfig_init(cfg: Struct) -> str:
    fields = {f[0]: f for f in py_fields(cfg)}
    ds = [fields[n] for n in DS_ORDER]
    ours = [f for n, f in fields.items() if n not in DS_ORDER]
    params = [(py, _py_hint_of(kind, DS_DEFAULTS[py]), DS_DEFAULTS[py]) for py, _c, kind, _d, _doc in ds]
    params += [(py, _py_hint_of(kind, d), d) for py, _c, kind, d, _doc in ours]
    docs = [(py, c, k, DS_DEFAULTS[py], doc) for py, c, k, _d, doc in ds] + ours
    ind = "    "
    out = _py_signature(params, len(ds), ind, "def __init__")
    out += _py_docstring(["``DeepSpeedTransformerConfig``'s arguments, in its positional order and with its",
                          "defaults, then the library's own (keywords). As in DeepSpeed, the sizes left at −1",
                          "(" + ", ".join(DS_REQUIRED) + ")",
                          "must be set before a layer is made: the layer raises otherwise.", ""], docs, ind * 2)
    out.append(ind * 2 + "self._assign(locals(), validate=False)")
    return "\n".join(out) + "\n"


_CTYPES = {"size_t": "c_size_t", "int32_t": "c_int32", "int64_t": "c_int64", "uint64_t": "c_uint64",
           "float": "c_float", "const char *": "c_char_p", "void *": "c_void_p"}
_CTYPES_STRUCTS = [("dst_tensor", "Tensor"), ("dst_mask", "Mask"), ("dst_param_info", "ParamInfo"),
                   ("dst_layer_config", "LayerConfig"), ("dst_checkpoint_options", "CheckpointOptions")]


def gen_ctypes(structs: Dict[str, Struct], enums: Dict[str, List[Tuple[str, int]]], defines: Dict[str, str]) -> str:
    out = ["# Enum values of the header (DST_ prefix dropped)."]
    for ename, vals in enums.items():
        out.append(f"# {ename}")
        for n, v in vals:
            out.append(f"{n[4:]} = {v}")
    for k in ("DST_MAX_DIMS",):
        out.append(f"{k[4:]} = {defines[k]}")
    pynames = dict(_CTYPES_STRUCTS)
    for cname, pyname in _CTYPES_STRUCTS:
        out += ["", "", f"class {pyname}(ctypes.Structure):", f'    """``{cname}``."""', "", "    _fields_ = ["]
        for f in structs[cname].fields:
            if f.ctype in pynames:
                t = pynames[f.ctype]
            elif f.ctype in enums:
                t = "ctypes.c_int"
            else:
                t = "ctypes." + _CTYPES[f.ctype]
            if f.array:
                t += " * " + (f.array[4:] if f.array.startswith("DST_") else f.array)
            out.append(f"        ({f.name!r}, {t}),")
        out.append("    ]")
    return "\n".join(out) + "\n"


#: DeepSpeed fields whose C field of the same name differs in some way.
SAME_NAME_NOTES = {
    "intermediate_size": "`intermediate_size`; 0 (DeepSpeed: ≤ 0) means 4·H",
    "seed": "`seed` seeds the initial weights; dropout's seed (DeepSpeed's use of it) is the context's: "
            "`dst_context_set_rng_state(ctx, seed, 0)`",
}


def gen_api_md_table(cfg: Struct) -> str:
    c_names = {f.name for f in cfg.fields}
    same = [n for n in DS_ORDER if n in c_names and n not in SAME_NAME_NOTES]
    out = ["| `DeepSpeedTransformerConfig` field | in `dst_layer_config` |", "|---|---|"]
    out.append("| " + ", ".join(f"`{n}`" for n in same) + " | the field of the same name |")
    for n, note in SAME_NAME_NOTES.items():
        out.append(f"| `{n}` | {note} |")
    for p in PY_ONLY:
        out.append(f"| `{p.name}` | {p.replaced_by} |")
    return "\n".join(out) + "\n"


def _options(opts: Struct) -> List[Field]:
    """The options the bindings present (struct_size and client_state_len folded away); each must be in
    the table, so that a new header field cannot slip past the bindings."""
    out = []
    for f in opts.fields:
        if f.name == "struct_size":
            continue
        if f.name not in OPTION_KINDS:
            sys.exit(f"{ME}: dst_checkpoint_options.{f.name} is new: add it to OPTION_KINDS and OPTION_DOCS")
        if OPTION_KINDS[f.name] != "len":
            out.append(f)
    return out


def _option_doc(f: Field, lang: str) -> str:
    none = {"java": "null", "rust": "`None`"}[lang]
    kind = OPTION_KINDS[f.name]
    if kind == "enum":
        e = ENUMS[f.ctype]
        v = e["values"][f.default.lstrip(":")]
        default = "{@link %s#%s}" % (e["java"], v[0]) if lang == "java" else "[`%s::%s`]" % (e["rust"], v[1])
    elif kind == "bool":
        default = "true" if f.default != "0" else "false"
    else:
        default = none
    doc = OPTION_DOCS[f.name].format(none=none, default=default)
    if lang == "java":
        doc = re.sub(r"`([^`]+)`", r"{@code \1}", doc)
    return doc


_JAVA_OPTION_TYPES = {"enum": None, "opt_str": "String", "bool": "boolean", "opt_dtype": "DType",
                      "opt_bytes": "byte[]"}


def _java_option_type(f: Field) -> str:
    k = OPTION_KINDS[f.name]
    return ENUMS[f.ctype]["java"] if k == "enum" else _JAVA_OPTION_TYPES[k]


def gen_java_options_fields(opts: Struct) -> str:
    return "".join(f"    private {_java_option_type(f)} {_camel(f.name)};\n" for f in _options(opts))


def gen_java_options_load(opts: Struct) -> str:
    out = []
    for f in _options(opts):
        k, v, get = OPTION_KINDS[f.name], _camel(f.name), f"raw.get{_swig_accessor(f.name)}()"
        expr = {"enum": f"{_java_option_type(f)}.fromRaw({get})", "opt_str": get, "bool": f"{get} != 0",
                "opt_dtype": f"optionalDType({get})", "opt_bytes": "null"}[k]
        out.append(f"            {v} = {expr};")
    return "\n".join(out) + "\n"


def gen_java_options_to_native(opts: Struct) -> str:
    out = []
    for f in _options(opts):
        k, v, acc = OPTION_KINDS[f.name], _camel(f.name), _swig_accessor(f.name)
        line = {"enum": f"raw.set{acc}({v}.raw());", "opt_str": f"raw.set{acc}({v});",
                "bool": f"raw.set{acc}({v} ? 1 : 0);",
                "opt_dtype": f"raw.set{acc}({v} == null ? -1 : {v}.raw().swigValue());",
                "opt_bytes": f"raw.set_{f.name}_bytes({v});"}[k]
        out.append("        " + line)
    return "\n".join(out) + "\n"


def _java_doc(doc: str, indent: str = "    ") -> List[str]:
    lines = _wrap(doc, 108, indent + "/** ", indent + " * ")
    if len(lines) == 1 and len(lines[0]) + 3 <= 112:
        return [lines[0] + " */"]
    return [indent + "/**"] + _wrap(doc, 108, indent + " * ", indent + " * ") + [indent + " */"]


def gen_java_options_accessors(opts: Struct) -> str:
    out = []
    for f in _options(opts):
        k, v, cap, jt = OPTION_KINDS[f.name], _camel(f.name), _camel(f.name, True), _java_option_type(f)
        doc = _option_doc(f, "java")
        if k == "opt_bytes":
            out += _java_doc("Save: the client state as text (its bytes decoded as UTF-8); null for none. Default null.")
            out += [f"    public String get{cap}() {{",
                    f"        return {v} == null ? null : new String({v}, StandardCharsets.UTF_8);", "    }", ""]
            out += _java_doc(f"Sets {{@code {v}}} as text, stored as its UTF-8 bytes (null for none); returns this.")
            out += [f"    public CheckpointOptions set{cap}(String value) {{",
                    f"        this.{v} = value == null ? null : value.getBytes(StandardCharsets.UTF_8);",
                    "        return this;", "    }", ""]
            out += _java_doc(doc)
            out += [f"    public byte[] get{cap}Bytes() {{", f"        return {v} == null ? null : {v}.clone();",
                    "    }", ""]
            out += _java_doc(f"Sets {{@code {v}}} to any bytes (NUL bytes and binary data included), kept "
                             "exactly; null for none. Returns this.")
            out += [f"    public CheckpointOptions set{cap}Bytes(byte[] value) {{",
                    f"        this.{v} = value == null ? null : value.clone();", "        return this;", "    }", ""]
            continue
        out += _java_doc(doc)
        out += [f"    public {jt} get{cap}() {{", f"        return {v};", "    }", ""]
        out += _java_doc(f"Sets {{@code {v}}} (see {{@link #get{cap}()}}); returns this.")
        out.append(f"    public CheckpointOptions set{cap}({jt} value) {{")
        if k == "enum":
            out.append(f"        this.{v} = Objects.requireNonNull(value, \"{v}\");")
        else:
            out.append(f"        this.{v} = value;")
        out += ["        return this;", "    }", ""]
    return "\n".join(out[:-1]) + "\n"


def _rust_option_type(f: Field) -> str:
    k = OPTION_KINDS[f.name]
    return {"enum": ENUMS[f.ctype]["rust"] if k == "enum" else "", "opt_str": "Option<String>", "bool": "bool",
            "opt_dtype": "Option<DType>", "opt_bytes": "Option<Vec<u8>>"}[k]


def gen_rust_options_fields(opts: Struct) -> str:
    out = []
    for f in _options(opts):
        out += _wrap(_option_doc(f, "rust"), 108, "    /// ", "    /// ")
        out.append(f"    pub {f.name}: {_rust_option_type(f)},")
    return "\n".join(out) + "\n"


def gen_rust_options_default(opts: Struct) -> str:
    out = []
    for f in _options(opts):
        k = OPTION_KINDS[f.name]
        if k == "enum":
            e = ENUMS[f.ctype]
            expr = f"{e['rust']}::from_raw(raw.{f.name}).unwrap_or({e['rust']}::{e['rust_fallback']})"
        elif k == "bool":
            expr = f"raw.{f.name} != 0"
        elif k == "opt_dtype":
            expr = f"optional_dtype(raw.{f.name})"
        else:
            expr = "None"
        out.append(f"            {f.name}: {expr},")
    return "\n".join(out) + "\n"


def gen_rust_options_to_raw(opts: Struct) -> str:
    out = []
    for f in _options(opts):
        k, n = OPTION_KINDS[f.name], f.name
        if k == "enum":
            out.append(f"        raw.{n} = self.{n}.to_raw();")
        elif k == "opt_str":
            out.append(f"        let {n} = self.{n}.as_deref();")
            out.append(f"        let {n} = {n}.map(|s| cstring(s, \"checkpoint {n}\")).transpose()?;")
            out.append(f"        raw.{n} = {n}.as_ref().map_or(ptr::null(), |c| c.as_ptr());")
            out.append(f"        strings.push({n});")
        elif k == "bool":
            out.append(f"        raw.{n} = self.{n} as i32;")
        elif k == "opt_dtype":
            out.append(f"        raw.{n} = self.{n}.map_or(-1, |d| d.to_raw().0 as i32);")
        else:  # bytes with a length, so that any bytes (NUL included) are kept; they live in `self`
            out.append(f"        if let Some(c) = &self.{n} {{")
            out.append(f"            raw.{n} = if c.is_empty() {{ b\"\\0\".as_ptr() }} else {{ c.as_ptr() }}.cast();")
            out.append(f"            raw.{n}_len = c.len();")
            out.append("        }")
    return "\n".join(out) + "\n"


# ---- regions ------------------------------------------------------------------------------------------


@dataclass
class Region:
    path: str  # relative to ROOT
    name: str  # "" = the whole file
    text: str


def _replace_region(content: str, name: str, text: str, path: str) -> str:
    pat = re.compile(r"(^[ \t]*(?://|#|<!--) BEGIN GENERATED " + re.escape(name) + r"\b[^\n]*\n)(.*?)"
                     r"(^[ \t]*(?://|#|<!--) END GENERATED " + re.escape(name) + r"\b[^\n]*$)", re.S | re.M)
    m = pat.search(content)
    if not m:
        sys.exit(f"{ME}: {path} has no region 'BEGIN GENERATED {name}' ... 'END GENERATED {name}'")
    return content[:m.start(2)] + text + content[m.end(2):]


def regions() -> List[Region]:
    structs, enums, defines = parse_header()
    classify(structs)
    cfg, opts = structs["dst_layer_config"], structs["dst_checkpoint_options"]
    java = "bindings/java/src/main/java/org/dstransformer/LayerConfig.java"
    jopt = "bindings/java/src/main/java/org/dstransformer/CheckpointOptions.java"
    return [
        Region("bindings/python/dstransformer/_fields.py", "", gen_py_fields_module(cfg, opts)),
        Region("bindings/python/dstransformer/_config.py", "LayerConfig.__init__", gen_py_layerconfig_init(cfg)),
        Region("bindings/python/dstransformer/_config.py", "TransformerConfig.__init__",
               gen_py_transformerconfig_init(cfg)),
        Region("bindings/ctypes/dst_ctypes.py", "structs", gen_ctypes(structs, enums, defines)),
        Region(java, "fields", gen_java_fields(cfg)),
        Region(java, "load", gen_java_load(cfg)),
        Region(java, "toNative", gen_java_to_native(cfg)),
        Region(java, "accessors", gen_java_accessors(cfg)),
        Region("bindings/rust/dstransformer/src/config.rs", "fields", gen_rust_config(cfg)),
        Region("docs/api.md", "deepspeed-fields", gen_api_md_table(cfg)),
        Region(jopt, "fields", gen_java_options_fields(opts)),
        Region(jopt, "defaults", gen_java_options_load(opts)),
        Region(jopt, "toNative", gen_java_options_to_native(opts)),
        Region(jopt, "accessors", gen_java_options_accessors(opts)),
        Region("bindings/rust/dstransformer/src/checkpoint.rs", "option fields", gen_rust_options_fields(opts)),
        Region("bindings/rust/dstransformer/src/checkpoint.rs", "option defaults", gen_rust_options_default(opts)),
        Region("bindings/rust/dstransformer/src/checkpoint.rs", "option to_raw", gen_rust_options_to_raw(opts)),
    ]


def render() -> Dict[str, Tuple[str, str]]:
    """path -> (current content, generated content)."""
    files: Dict[str, Tuple[str, str]] = {}
    for r in regions():
        full = os.path.join(ROOT, r.path)
        if r.path not in files:
            try:
                with open(full, encoding="utf-8") as f:
                    cur = f.read()
            except FileNotFoundError:
                cur = ""
            files[r.path] = (cur, cur)
        cur, new = files[r.path]
        new = r.text if not r.name else _replace_region(new, r.name, r.text, r.path)
        files[r.path] = (cur, new)
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail (exit 1) when a checked-in copy is stale")
    args = ap.parse_args(argv)
    stale = 0
    for path, (cur, new) in render().items():
        if cur == new:
            continue
        if args.check:
            stale += 1
            sys.stdout.writelines(difflib.unified_diff(cur.splitlines(True), new.splitlines(True),
                                                       "a/" + path, "b/" + path))
        else:
            with open(os.path.join(ROOT, path), "w", encoding="utf-8") as f:
                f.write(new)
            print(f"{ME}: wrote {path}")
    if stale:
        print(f"{ME}: {stale} file(s) are stale: the header or the table changed. Run `python3 {ME}` and "
              "commit the result.", file=sys.stderr)
        return 1
    if args.check:
        print(f"{ME}: every generated field list matches the header")
    return 0


if __name__ == "__main__":
    sys.exit(main())
