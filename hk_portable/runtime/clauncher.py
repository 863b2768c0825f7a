"""The compiled launcher: clauncher.c built with the host C compiler at first use, cached next to the compile
cache, loaded with importlib; where it cannot be built (no compiler, no Python headers, a failed build,
HK_C_LAUNCHER=0) every caller keeps its Python path and `reason()` says why (`hk backends` prints it).

What it speeds up (docs/ARCHITECTURE.md section 1.1): Kernel.__call__'s fast path (`fastcall`: the
argument-kind key, the lookup, the grid check and the backend's fast_launch in one call; `signature` and
`grid3` are its pieces), and for a GPU backend the whole launch: packing the hk::gl parameter buffer and
calling cuLaunchKernel / hipModuleLaunchKernel by address (`Launcher`, one per loaded kernel and device;
`ByDevice`, one per artifact, picks the current device's). It is one generic module, not one per kernel
signature: a kernel's parameter layout is data the Launcher is built with.

The shared object is keyed by the sha256 of the C source, the Python ABI (extension suffix, version) and
the platform; it lives in `<cache>/launcher/` (the cache directory's ownership checks apply: it is loaded
code, as SECURITY.md says) or, when the cache directory is unusable, in a private temporary directory of
this process. Builds are atomic (temp file + os.replace): racing processes both win.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import torch

from . import cachefiles, selection

SOURCE = Path(__file__).with_name("clauncher.c")
ENV = "HK_C_LAUNCHER"
ABI = 3                                    # HK_LAUNCHER_ABI in clauncher.c
# a Launcher's statuses besides 0 (launched) and > 0 (the launch function's error), as clauncher.c numbers them
LAUNCH_REFUSED, STREAM_NOT_A_HANDLE, GRID_REFUSED = -1, -3, -4
MODULE = "_hk_launcher"                    # PyInit__hk_launcher
CFLAGS = ("-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-std=c11")
COMPILERS = ("cc", "gcc", "clang", "clang-21", "clang-20", "clang-19", "clang-18")
BUILD_TIMEOUT_S = 120

log = logging.getLogger("hk_portable.launcher")

_lock = threading.Lock()
_module = None                             # the loaded module, once loaded
_reason: str | None = None                 # why there is none (set once a build was tried, or it was disabled)
_path: Path | None = None


# ------------------------------------------------------------------------------------ Python forms
def _py_signature(args) -> tuple:
    """The argument-kind key of a kernel call, flat: per tensor its dtype, rank and device, per other value
    its type (clauncher.c's `signature` returns the same tuple)."""
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig += (a.dtype, a.ndim, a.device)
        else:
            sig.append(type(a))
    return tuple(sig)


def call_key(args, kwargs, backend, target) -> tuple:
    """The fast-path key of a kernel call (clauncher.c's fastcall builds the same tuple): the arguments'
    kinds, the consts as passed, the backend (a spec, or the object's id), the target, and the selection
    inputs (the use_backend context, HK_BACKEND as stored), so a change of backend never reuses a stale
    choice."""
    return (signature(args), tuple(kwargs.items()) if kwargs else (),
            backend if backend is None or backend.__class__ is str else id(backend), target,
            selection._context.get(), selection.env_backend_raw())


def _py_fastcall(table, nargs, args, kwargs, backend, target, stream, grid, _Tensor=torch.Tensor):
    """Kernel.__call__'s fast-path lookup (clauncher.c's fastcall without its launch): the hit (backend,
    artifact, fast_launch) for Python to launch, [key] on a miss, False when the call does not qualify.
    call_key and _py_signature inline: this is the call path without a compiler."""
    if len(args) != nargs:
        return False
    sig = []
    for a in args:
        if isinstance(a, _Tensor):
            sig += (a.dtype, a.ndim, a.device)
        else:
            sig.append(type(a))
    key = (tuple(sig), tuple(kwargs.items()) if kwargs else (),
           backend if backend is None or backend.__class__ is str else id(backend), target,
           _context_get(), _env_backend())
    try:
        hit = table.get(key)
    except TypeError:           # an unhashable const: the slow path reports it
        return False
    return [key] if hit is None else hit


_context_get = selection._context.get
_env_backend = (functools.partial(selection._ENV_STORE.get, selection._ENV_KEY) if selection._ENV_STORE is not None
                else selection.env_backend_raw)


signature = _py_signature      # rebound to the compiled functions once the module is loaded
fastcall = _py_fastcall


# ------------------------------------------------------------------------------------------- build
def switched_on(env: str) -> bool:
    """Whether the switch `env` (HK_C_LAUNCHER, HK_OP_REPLAY) leaves its compiled path on (the default)."""
    return os.environ.get(env, "1").strip().lower() not in ("0", "false", "no", "off")


def enabled() -> bool:
    return switched_on(ENV)


def find_compiler(env: str, names: tuple[str, ...]) -> list[str] | None:
    """A host compiler as a command: $env split as a shell would, else the first of `names` on PATH."""
    given = os.environ.get(env)
    if given:
        import shlex
        return shlex.split(given)
    for name in names:
        found = shutil.which(name)
        if found:
            return [found]
    return None


def compiler() -> list[str] | None:
    """The host C compiler as a command: $CC, else the first of COMPILERS on PATH."""
    return find_compiler("CC", COMPILERS)


def python_include() -> Path | None:
    """The directory of Python.h for this interpreter, if installed (Debian: python3-dev)."""
    inc = sysconfig.get_paths().get("include")
    return Path(inc) if inc and (Path(inc) / "Python.h").is_file() else None


def key(source: bytes | None = None) -> str:
    """What the shared object depends on: the source, the Python ABI and the platform."""
    src = SOURCE.read_bytes() if source is None else source
    parts = [hashlib.sha256(src).hexdigest(), sysconfig.get_config_var("EXT_SUFFIX") or "", sys.version,
             sysconfig.get_platform(), " ".join(CFLAGS)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _root() -> tuple[Path, Path | None]:
    """<cache>/launcher (checked) and the cache root it is checked from; with an unusable cache, a directory
    under this process's private one and None."""
    from .cache import cache_dir
    base = cache_dir()
    if base is not None:
        try:
            return cachefiles.subdir(base, "launcher"), base
        except (OSError, cachefiles.UnsafeCacheDir):
            pass
    return cachefiles.private_dir() / "launcher", None


def path() -> Path:
    """Where this source's shared object for this Python belongs (ensure_built says where it really is)."""
    global _path
    if _path is None:
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        _path = _root()[0] / f"{MODULE}-{key()}{suffix}"
    return _path


def build(dest: Path) -> None:
    """Compile clauncher.c into `dest` (atomically). RuntimeError with the reason when it cannot."""
    cc = compiler()
    if cc is None:
        raise RuntimeError(f"no host C compiler ($CC or one of {', '.join(COMPILERS)})")
    inc = python_include()
    if inc is None:
        raise RuntimeError(f"no Python headers (Python.h) under {sysconfig.get_paths().get('include')}; "
                           "install python3-dev or your Python's development package")
    extra = ["-undefined", "dynamic_lookup"] if sys.platform == "darwin" else []
    compile_shared([*cc, *CFLAGS, *extra, "-I", str(inc), str(SOURCE)], [], dest)


def compile_shared(cmd: list[str], tail: list[str], out: Path, timeout_s: int = BUILD_TIMEOUT_S) -> None:
    """Run `cmd + ["-o", out] + tail`; RuntimeError with the compiler's words when it fails. ensure_built runs
    it in a private build directory and moves the result into place (the compiled op replay builds through it
    too)."""
    full = [*cmd, "-o", str(out), *tail]
    try:
        res = subprocess.run(full, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"{cmd[0]} failed to run: {e}") from None
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed (exit {res.returncode}): {(res.stderr or res.stdout)[-1500:]}")


def cache_root() -> Path:
    """The directory compiled host modules belong in: <cache>/launcher, or a private temporary one."""
    return _root()[0]


def ensure_built(p: Path, build_fn, build_if_missing: bool) -> Path | None:
    """The shared object `p` checked against the hash recorded when it was built, or its private copy where the
    cache cannot take it; built by build_fn(out) first where it is missing or fails the check and building is
    allowed (else None). Also op replay's."""
    root = _root()[1]
    if not build_if_missing:
        return cachefiles.found(p, root)

    def build(tmp: Path) -> Path:
        build_fn(tmp / p.name)
        return tmp / p.name
    return cachefiles.built_file(p, build, root)


def failure_reason(e: Exception) -> str:
    """Why a compiled module is unavailable, from its failure: a RuntimeError's words (ours), else the type too."""
    return str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"


def import_extension(p: Path, name: str):
    """The compiled extension module at `p`, imported as hk_portable.<name> (also op replay's)."""
    spec = importlib.util.spec_from_file_location(f"hk_portable.{name}", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _import(p: Path):
    mod = import_extension(p, MODULE)
    if getattr(mod, "ABI", None) != ABI or (mod.LAUNCH_REFUSED, mod.STREAM_NOT_A_HANDLE, mod.GRID_REFUSED) != (
            LAUNCH_REFUSED, STREAM_NOT_A_HANDLE, GRID_REFUSED):
        raise RuntimeError(f"{p} has launcher ABI {getattr(mod, 'ABI', None)}, expected {ABI}")
    mod.set_tensor_type(torch.Tensor)
    mod.configure(selection._context, selection._ENV_STORE, selection._ENV_KEY, selection.env_backend_raw)
    return mod


def load(build_if_missing: bool = True):
    """The compiled module, or None (reason() says why). Loaded once per process; with
    build_if_missing=False only a shared object already on disk is loaded (no compiler runs)."""
    global _module, _reason, signature, fastcall
    if _module is not None or _reason is not None:
        return _module
    with _lock:
        if _module is not None or _reason is not None:
            return _module
        if not enabled():
            _reason = f"disabled by {ENV}={os.environ.get(ENV)}"
            return None
        try:
            p = ensure_built(path(), build, build_if_missing)
            if p is None:
                return None
            mod = _import(p)
        except Exception as e:  # noqa: BLE001 - any failure means the Python path, with the reason kept
            _reason = failure_reason(e)
            log.debug("hk_portable: compiled launcher unavailable, using the Python path: %s", _reason)
            return None
        signature, fastcall = mod.signature, mod.fastcall
        _module = mod
        log.debug("hk_portable: compiled launcher loaded from %s", p)
        return mod


def reason() -> str | None:
    """Why the compiled launcher is not in use (None when it is, or has not been asked for yet)."""
    return _reason


def describe() -> str:
    """One line for `hk backends`: which launcher runs GPU launches, and why."""
    mod = load()
    if mod is not None:
        return f"compiled C launcher ({mod.__file__})"
    return f"Python launcher (ctypes); the compiled one is unavailable: {_reason}"


def reset() -> None:
    """Forget the loaded module and any failure (tests; the process keeps a loaded extension)."""
    global _module, _reason, signature, fastcall, _path
    with _lock:
        _module, _reason, _path = None, None, None
        signature, fastcall = _py_signature, _py_fastcall
