"""C++ source handling with regexes: the rewrites load() applies before preprocessing, kernel discovery
in the preprocessed text (with their declared work-group bounds), and the removal of AMDGPU attributes
the host compiler does not know."""
from __future__ import annotations

import re

from .errors import CompileError
from .runtime_abi import LDS_DMA_WIDE

_QUALIFIER_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(__global__|__device__|__shared__|__host__|__constant__)\b.*$",
                               re.M)
_RAW_ATTR = {"global": "__global__", "shared": "__shared__", "device": "__device__"}
_EXTERN_SHARED = re.compile(r'\bextern(\s+"C")?\s+__shared__\b([^;{}]*?\[\s*\])\s*;')
_STATIC_SHARED = re.compile(r"\bstatic\s+__shared__\b|\b__shared__\s+static\b")
_AMDGPU_ATTR = re.compile(
    r"(?P<ns>\bclang::)?\b(?P<name>amdgpu_flat_work_group_size|amdgpu_waves_per_eu|amdgpu_num_vgpr|"
    r"amdgpu_num_sgpr|amdgpu_max_num_work_groups|launch_bounds)\s*\((?P<args>[^()]*(?:\([^()]*\)[^()]*)*)\)")

# hk_emu.h defines __global__ as this annotation, so kernels can be found after preprocessing
_KMARK = '__attribute__((annotate("hk_emu_kernel")))'
_IDENT = re.compile(r"[A-Za-z_]\w*")


def rewrite_source(src: str) -> str:
    """The three source rewrites load() applies before preprocessing (README: what load() does)."""
    src = _QUALIFIER_DEFINE.sub(lambda m: f"/* hk_emu: the emulator header defines {m.group(1)} */", src)
    src = re.sub(r"__attribute__\s*\(\(\s*(global|shared|device)\s*\)\)", lambda m: _RAW_ATTR[m.group(1)], src)
    src = _EXTERN_SHARED.sub(lambda m: f'extern{m.group(1) or ""} {m.group(2).strip()} __asm__("hk_emu_dyn_lds");',
                             src)
    src = _STATIC_SHARED.sub("__shared__", src)
    return src


def strip_amdgpu_attrs(ii: str) -> str:
    """Replace the AMDGPU-only attributes (their bounds were read by find_kernels) with harmless ones."""
    return _AMDGPU_ATTR.sub(lambda m: "maybe_unused" if m.group("ns") else "unused", ii)


def find_kernels(ii: str) -> dict[str, dict]:
    """Kernels defined in the preprocessed text: name -> {"bounds": (lo_expr, hi_expr) | None}."""
    kernels: dict[str, dict] = {}
    pos = 0
    while True:
        at = ii.find(_KMARK, pos)
        if at < 0:
            break
        pos = at + len(_KMARK)
        name, i = _declarator(ii, pos)
        if name is None:
            break
        end = _skip_parens(ii, i)
        k = _skip_attributes(ii, end)
        if k >= len(ii) or ii[k] != "{":
            continue  # a declaration
        start = max(ii.rfind(";", 0, at), ii.rfind("}", 0, at), ii.rfind("\n#", 0, at))
        kernels[name] = {"bounds": _declared_bounds(ii[start + 1:k])}
        pos = end
    return kernels


def _declarator(ii: str, i: int) -> tuple[str | None, int]:
    """From just after a kernel mark: the declared function's name and the index of its '(' (skipping
    attributes, linkage and the return type), or (None, end of text)."""
    while i < len(ii):
        while i < len(ii) and ii[i].isspace():
            i += 1
        if ii.startswith("__attribute__", i):
            j = ii.find("(", i)
            i = _skip_parens(ii, j)
            continue
        if ii.startswith("[[", i):
            i = ii.find("]]", i) + 2
            continue
        m = _IDENT.match(ii, i)
        if m:
            i = m.end()
            k = i
            while k < len(ii) and ii[k].isspace():
                k += 1
            if k < len(ii) and ii[k] == "(":
                return m.group(0), k
            continue
        if ii.startswith('"C"', i):
            i += 3
            continue
        i += 1
    return None, i


def _skip_attributes(ii: str, k: int) -> int:
    """Index of the first character from k on that is neither white space nor an __attribute__((...))."""
    while k < len(ii):
        while k < len(ii) and ii[k].isspace():
            k += 1
        if ii.startswith("__attribute__", k):
            k = _skip_parens(ii, ii.find("(", k))
            continue
        break
    return k


def _declared_bounds(decl: str) -> tuple[str, str] | None:
    """(lo, hi) expressions of amdgpu_flat_work_group_size, else (1, n) of launch_bounds(n), else None."""
    bounds = None
    for m in _AMDGPU_ATTR.finditer(decl):
        if m.group("name") == "amdgpu_flat_work_group_size":
            a = _split_top(m.group("args"))
            if len(a) == 2:
                bounds = (a[0], a[1])
        elif m.group("name") == "launch_bounds" and bounds is None:
            a = _split_top(m.group("args"))
            if a and a[0]:
                bounds = ("1", a[0])
    return bounds


def _split_top(s: str) -> list[str]:
    """Split at the commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [x.strip() for x in out]


def _skip_parens(text: str, i: int) -> int:
    """text[i] == '('; index just past the matching ')'."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i



# ---------------------------------------------------------------------------------------------------
# Inline assembly
# ---------------------------------------------------------------------------------------------------
# The host compiler cannot take AMD instructions, and replacing an asm statement by the builtin it stands
# for would skip the asm's own operand binding (M0, the offsets, the resource). So every asm statement of
# the device code is parsed here, checked against the instructions the emulator models, and replaced by
# calls that execute it from its operands (hk_emu.h, hk_emu::inline_asm). Anything else is a CompileError
# naming the asm. Bump REWRITE_VERSION when what these rewrites produce changes (it is part of the
# build cache key).
REWRITE_VERSION = 2

_ASM_START = re.compile(r"\b(?:asm|__asm__|__asm)\b")
_ASM_QUALIFIERS = {"volatile", "__volatile__", "__volatile", "inline", "__inline", "__inline__", "goto"}
_LINEMARKER = re.compile(r'^#\s*(\d+)\s+"((?:[^"\\]|\\.)*)"([ \d]*)$', re.M)
_LDS_LOAD_SIZES = {"ubyte": 1, "ushort": 2, "dword": 4, "dwordx3": 12, "dwordx4": 16}
_BUFFER_LDS = re.compile(r"buffer_load_(?P<op>ubyte|ushort|dwordx3|dwordx4|dword)\s+%(?P<v>\d+)\s*,\s*%(?P<s>\d+)\s*,"
                         r"\s*(?:(?P<soff_imm>\d+)|%(?P<soff>\d+))(?P<mods>(?:\s*,?\s*[a-z0-9_]+(?::\d+)?)*)\s*$")
_S_NOP = re.compile(r"s_nop\s+(\d+)\s*$")


class _Asm:
    """One parsed asm statement: where it is, its template and its operand lists."""

    def __init__(self, start, end, text, template, outputs, inputs, clobbers, file, line):
        self.start, self.end, self.text = start, end, text
        self.template, self.outputs, self.inputs, self.clobbers = template, outputs, inputs, clobbers
        self.file, self.line = file, line

    def where(self) -> str:
        return f"{self.file}:{self.line}: inline asm {self.template!r}"


def rewrite_inline_asm(ii: str, arch: str) -> str:
    """Replace each asm statement outside system headers in the preprocessed text by the emulator's
    execution of it; CompileError for any asm the emulator does not model. Line numbers are kept."""
    out, pos = [], 0
    for a in _asm_statements(ii):
        out.append(ii[pos:a.start])
        out.append(_lower(a, arch) + "\n" * a.text.count("\n"))
        pos = a.end
    out.append(ii[pos:])
    return "".join(out)


def _asm_statements(ii: str):
    marks = [(m.start(), m) for m in _LINEMARKER.finditer(ii)]
    mi, i = 0, 0
    while True:
        m = _ASM_START.search(ii, i)
        if m is None:
            return
        i = m.end()
        if _in_string_or_comment(ii, m.start()):
            continue
        while mi + 1 < len(marks) and marks[mi + 1][0] < m.start():
            mi += 1
        file, line, system = "<source>", 1, False
        if marks and marks[mi][0] < m.start():
            lm = marks[mi][1]
            file, system = lm.group(2), "3" in lm.group(3).split()
            line = int(lm.group(1)) + ii.count("\n", lm.end() + 1, m.start())
        if system:
            continue
        k, quals = m.end(), []
        while True:
            while k < len(ii) and ii[k].isspace():
                k += 1
            w = _IDENT.match(ii, k)
            if w and w.group(0) in _ASM_QUALIFIERS:
                quals.append(w.group(0))
                k = w.end()
                continue
            break
        if k >= len(ii) or ii[k] != "(":
            continue
        prev = ii[max(0, m.start() - 256):m.start()].rstrip()
        statement = bool(quals) or not prev or prev[-1] in ";{}:" or re.search(r"\b(else|do)$", prev)
        if not statement:
            continue        # an asm label of a declaration (e.g. __asm__("hk_emu_dyn_lds")): not code
        end = _skip_parens(ii, k)
        body = ii[k + 1:end - 1]
        parts = _split_asm(body, ":")
        template = _string_value(parts[0], file, line)
        ops = [_operands(p, file, line) if p.strip() else [] for p in parts[1:3]]
        while len(ops) < 2:
            ops.append([])
        clobbers = [_string_value(c, file, line) for c in _split_asm(parts[3], ",") if c.strip()] \
            if len(parts) > 3 else []
        if "goto" in quals or len(parts) > 4:
            raise CompileError(f"{file}:{line}: inline asm goto is not emulated", ii[m.start():end])
        yield _Asm(m.start(), end, ii[m.start():end], template, ops[0], ops[1], clobbers, file, line)
        i = end


def _split_asm(s: str, sep: str) -> list[str]:
    """Split at `sep` outside string literals and brackets (a "::" is never a separator)."""
    out, depth, cur, q, j = [], 0, "", None, 0
    while j < len(s):
        c = s[j]
        if q:
            cur += c
            if c == "\\" and j + 1 < len(s):
                cur += s[j + 1]
                j += 1
            elif c == q:
                q = None
        elif c in "\"'":
            q = c
            cur += c
        elif c in "([{":
            depth += 1
            cur += c
        elif c in ")]}":
            depth -= 1
            cur += c
        elif sep == ":" and c == ":" and s.startswith("::", j):
            cur += "::"
            j += 1
        elif c == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
        j += 1
    out.append(cur)
    return out


def _in_string_or_comment(ii: str, at: int) -> bool:
    """Whether `at` lies inside a string literal on its line (preprocessed text has no comments)."""
    ls = ii.rfind("\n", 0, at) + 1
    seg, q, j = ii[ls:at], None, 0
    while j < len(seg):
        c = seg[j]
        if q:
            if c == "\\":
                j += 1
            elif c == q:
                q = None
        elif c in "\"'":
            q = c
        j += 1
    return q is not None


def _string_value(s: str, file: str, line: int) -> str:
    """The value of one or more adjacent narrow string literals."""
    s, val = s.strip(), ""
    pos = 0
    while pos < len(s):
        m = re.match(r'\s*"((?:[^"\\]|\\.)*)"', s[pos:])
        if not m:
            raise CompileError(f"{file}:{line}: inline asm: expected a string literal, got {s!r}", s)
        val += _unescape(m.group(1))
        pos += m.end()
    return val


def _unescape(s: str) -> str:
    esc = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
    out, j = "", 0
    while j < len(s):
        if s[j] == "\\" and j + 1 < len(s) and s[j + 1] in esc:
            out += esc[s[j + 1]]
            j += 2
        else:
            out += s[j]
            j += 1
    return out


def _operands(s: str, file: str, line: int) -> list[tuple[str, str]]:
    """[(constraint, expression)] of an asm operand list."""
    ops = []
    for o in _split_asm(s, ","):
        m = re.match(r'\s*(?:\[\s*\w+\s*\]\s*)?"((?:[^"\\]|\\.)*)"\s*\((.*)\)\s*$', o, re.S)
        if not m:
            raise CompileError(f"{file}:{line}: inline asm: cannot read the operand {o.strip()!r}", s)
        ops.append((_unescape(m.group(1)), m.group(2).strip()))
    return ops


def _lower(a: _Asm, arch: str) -> str:
    """The C++ that executes asm statement `a` in the emulator (see the table of instructions above)."""
    def fail(why: str):
        raise CompileError(f"{a.where()}: {why} (the emulator executes only the inline asm it models: "
                           "README.md, 'Inline assembly')", a.text)

    insns = [x.strip() for x in re.split(r"[\n;]", a.template) if x.strip()]
    if not insns:
        if a.outputs or a.inputs:
            fail("an empty template with operands")
        return a.text         # asm volatile(""): an optimisation barrier, the host compiler keeps it
    if a.outputs:
        fail("output operands are not emulated")
    binds = [(c, f"hk_asm_in{k}_") for k, (c, _e) in enumerate(a.inputs)]
    m0 = [e for c, e in binds if c == "{m0}"]
    calls, waits = [], 0        # waits: wait states since the asm began (the compiler writes M0 just before)
    for ins in insns:
        n = _S_NOP.match(ins)
        if n:
            if int(n.group(1)) > 15:
                fail(f"s_nop {n.group(1)}: the count is 4 bits")
            waits += int(n.group(1)) + 1
            continue
        b = _BUFFER_LDS.match(ins)
        if not b:
            fail(f"instruction {ins!r} is not modeled")
        mods = [x for x in re.split(r"[\s,]+", b.group("mods").strip()) if x]
        offset, flags = 0, set()
        for x in mods:
            if x.startswith("offset:"):
                offset = int(x[7:])
            elif x in ("offen", "lds", "sc0", "sc1", "nt"):
                flags.add(x)
            else:
                fail(f"modifier {x!r} of {ins!r} is not modeled")
        if "lds" not in flags:
            fail(f"{ins!r}: only the LDS form (lds) of buffer loads is modeled in inline asm")
        if "offen" not in flags:
            fail(f"{ins!r}: only the offen addressing (a VGPR byte offset) is modeled")
        if not 0 <= offset < 4096:
            fail(f"{ins!r}: offset:{offset} does not fit the 12-bit field")
        size = _LDS_LOAD_SIZES[b.group("op")]
        if size > 4 and arch not in LDS_DMA_WIDE:
            fail(f"{ins!r}: LDS-DMA of {size} bytes per lane is gfx950-only")

        def operand(idx: str, want: tuple[str, ...]) -> str:
            k = int(idx)
            if k >= len(binds):
                fail(f"%{k} names no operand")
            c, e = binds[k]
            if c not in want:
                fail(f"%{k} of {ins!r} is bound with constraint {c!r}; expected {' or '.join(map(repr, want))}")
            return e

        vaddr = operand(b.group("v"), ("v",))
        rsrc = operand(b.group("s"), ("s",))
        soff = f"{int(b.group('soff_imm'))}u" if b.group("soff_imm") is not None else \
            f"::hk_emu::inline_asm::reg32({operand(b.group('soff'), ('s',))})"
        if b.group("soff_imm") is not None and int(b.group("soff_imm")) > 64:
            fail(f"{ins!r}: soffset {b.group('soff_imm')} is not an inline constant (0..64)")
        if len(m0) != 1:
            fail(f"{ins!r} reads M0 (its LDS address), but the asm binds {len(m0)} \"{{m0}}\" operands, not one")
        if waits < 1:
            fail(f"{ins!r} reads M0 in the first wait state after the compiler's write of it: gfx9 needs one "
                 "wait state between an SALU write of M0 and an LDS-DMA (s_nop 0 first)")
        if "memory" not in a.clobbers:
            fail(f"{ins!r} writes LDS, but the asm has no \"memory\" clobber: the device compiler may move LDS "
                 "accesses across it")
        calls.append(f"::hk_emu::inline_asm::buffer_load_lds({size}u, ::hk_emu::inline_asm::reg32({vaddr}), "
                     f"::hk_emu::inline_asm::srsrc({rsrc}), {soff}, {offset}, "
                     f"::hk_emu::inline_asm::reg32({m0[0]}), __builtin_FILE(), __builtin_LINE());")
        waits += 1
    # input operands are evaluated once, before the instructions, as the device compiler does
    decls = [f"const auto hk_asm_in{k}_ = ({e});" for k, (_c, e) in enumerate(a.inputs)]
    return "do { " + " ".join(decls + calls) + " } while (0)"
