"""A kernel's name on its way into generated code: generated source, symbols, comments and file names
only ever see c_symbol(name), a C identifier (so nothing in it can end a comment, a string or a path)."""
from __future__ import annotations

import hashlib
import re

MAX_SYMBOL = 64                              # long enough to read, short enough for every toolchain
_HASH_LEN = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# reserved in C/C++ ("__" anywhere, "_X") or by the generated code ("hk_", "HK_"): such names are mangled
_RESERVED_PREFIXES = ("hk_", "HK_")
_KEYWORDS = frozenset("""alignas alignof and asm auto bool break case catch char class const constexpr continue
    decltype default delete do double else enum explicit export extern false float for friend goto if inline int
    long main mutable namespace new noexcept not nullptr operator or private protected public register return
    short signed sizeof static struct switch template this throw true try typedef typeid typename union unsigned
    using virtual void volatile while and_eq bitand bitor compl not_eq or_eq xor xor_eq char8_t char16_t char32_t
    wchar_t co_await co_return co_yield concept consteval constinit requires static_assert thread_local
    dynamic_cast static_cast reinterpret_cast const_cast NULL assert errno offsetof""".split())   # + common macros


def is_identifier(name) -> bool:
    return isinstance(name, str) and bool(_IDENTIFIER.match(name))


def is_safe_symbol(name: str) -> bool:
    """Whether `name` is used as its own symbol (an identifier, not reserved, not too long)."""
    return (isinstance(name, str) and len(name) <= MAX_SYMBOL and bool(_IDENTIFIER.match(name))
            and "__" not in name and not name.startswith(_RESERVED_PREFIXES)
            and not (name[:1] == "_" and name[1:2].isupper())
            and name not in _KEYWORDS)


def c_symbol(name: str) -> str:
    """A C identifier for a user's kernel name: `name` itself when safe; otherwise [A-Za-z0-9_] kept,
    everything else '_', a 'k_' prefix where needed, and a hash of the original name appended, so two
    distinct names never share a symbol and the same name always gets the same one."""
    if is_safe_symbol(name):
        return name
    digest = hashlib.sha256(str(name).encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LEN]
    stem = re.sub(r"_+", "_", _UNSAFE.sub("_", str(name))).strip("_") or "kernel"
    stem = "k_" + stem if not stem[0].isalpha() or stem.startswith(("hk_", "HK_")) or stem in _KEYWORDS else stem
    return f"{stem[:MAX_SYMBOL - _HASH_LEN - 1].rstrip('_')}_{digest}"

