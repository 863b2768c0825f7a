"""C++ source handling with regexes: the rewrites load() applies before preprocessing, kernel discovery
in the preprocessed text (with their declared work-group bounds), and the removal of AMDGPU attributes
the host compiler does not know."""
from __future__ import annotations

import re

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
