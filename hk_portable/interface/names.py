"""User strings on their way into generated code: a kernel's name becomes a C identifier, text for a
comment loses what could end the comment. Generated source, symbols and file names only ever see these."""
from __future__ import annotations

import hashlib
import re

MAX_SYMBOL = 64                              # long enough to read, short enough for every toolchain
_HASH_LEN = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# reserved in C/C++ (and by our own generated names): kept readable, made distinct with a prefix
_RESERVED_PREFIXES = ("__", "hk_", "HK_")
_KEYWORDS = frozenset("""alignas alignof and asm auto bool break case catch char class const constexpr continue
    decltype default delete do double else enum explicit export extern false float for friend goto if inline int
    long main mutable namespace new noexcept not nullptr operator or private protected public register return
    short signed sizeof static struct switch template this throw true try typedef typeid typename union unsigned
    using virtual void volatile while""".split())


def is_identifier(name) -> bool:
    return isinstance(name, str) and bool(_IDENTIFIER.match(name))


def is_safe_symbol(name: str) -> bool:
    """Whether `name` is used as its own symbol (an identifier, not reserved, not too long)."""
    return (isinstance(name, str) and len(name) <= MAX_SYMBOL and bool(_IDENTIFIER.match(name))
            and not name.startswith(_RESERVED_PREFIXES) and not (name[:1] == "_" and name[1:2].isupper())
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
    return f"{stem[:MAX_SYMBOL - _HASH_LEN - 1]}_{digest}"


def comment_text(text: str) -> str:
    """`text` fit for a `//` or `/* */` comment: one line of printable ASCII, no comment delimiters."""
    s = "".join(ch if " " <= ch <= "~" else "_" for ch in str(text))
    return s.replace("*/", "*_/").replace("/*", "/_*").replace("\\", "/")
