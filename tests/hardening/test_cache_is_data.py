"""The compile cache stores data, never code (issue 14, item 2): JSON metadata and raw bytes, read by a
parser that cannot execute anything; unsafe directories are refused (memory instead); corrupt, truncated,
tampered, read-only, full and concurrently written entries are all misses or harmless failures."""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import math
import multiprocessing
import os
import pickle
import re
import warnings
from pathlib import Path

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, f32
from hk_portable.interface.backend import Artifact
from hk_portable.runtime import cache, cachefiles, registry


def _scale(x: GL[2], y: GL[2], *, BM: hk.const = 16, BN: hk.const = 32):
    m, n = hk.block_idx(0), hk.block_idx(1)
    t = hk.load(RT[f32, BM, BN], x, (m, n))
    hk.store(y, t * 3.0, (m, n))


KERNEL = hk.kernel(_scale, name="cache_scale")


def _program(bn=32):
    x = torch.empty(32, 64, device="meta")
    return KERNEL.trace(x, x, BN=bn)


@pytest.fixture
def hip(tmp_path, monkeypatch):
    """The hip backend (compile-only gfx942: source always, ISA when clang is here), counting compiles."""
    monkeypatch.setenv("HK_CACHE_DIR", str(tmp_path / "cache"))
    be = registry.load("hip")
    calls = []
    real = type(be).compile

    def counting(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(type(be), "compile", counting)
    return be, be.target("gfx942", emulated=False), calls


def _entries(root: Path):
    return sorted(p for p in root.rglob("*.hkc"))


def _fields(a: Artifact) -> dict:
    d = dataclasses.asdict(a)
    d.pop("payload")
    return d


# ------------------------------------------------------------------------------------------ round trip
def test_every_artifact_field_round_trips():
    art = Artifact("b", "t", "k", "h", source="s\n", binary=b"\x00\xffELF", asm=None,
                   launch={"block": (128, 1, 1), "params": [("x", "gl<f32,2>")], "nested": {"t": ((1, 2), [3])}},
                   resources={"nan": math.inf, "bytes": b"\x01", "none": None, "flag": True},
                   options={"ftz": False, "flags": ["-O3"]}, payload=object())
    back = cache.decode("key", cache.encode("key", art))
    assert _fields(back) == _fields(art) and back.payload is None
    assert isinstance(back.launch["block"], tuple) and isinstance(back.launch["params"][0], tuple)


def test_hip_artifact_round_trips_through_the_disk(hip, tmp_path):
    be, tgt, calls = hip
    prog = _program()
    art = cache.compile_cached(be, prog, tgt)
    again = cache.compile_cached(be, prog, tgt)
    assert calls == [1] and again is not art
    assert _fields(again) == _fields(art) and again.payload is prog
    (entry,) = _entries(tmp_path / "cache")
    blob = entry.read_bytes()
    assert blob.startswith(cache.MAGIC) and b"\x80\x04\x95" not in blob[:64]    # no pickle protocol header


@pytest.mark.parametrize("spec", ["cuda:sm_80", "cuda:sm_90a", "cuda:sm_80:emulated", "hip:gfx942:emulated"])
def test_artifacts_of_every_target_round_trip_and_run(spec, tmp_path, monkeypatch):
    monkeypatch.setenv("HK_CACHE_DIR", str(tmp_path))
    name, arch, *emu = spec.split(":")
    be = registry.load(name)
    if name == "cuda":
        pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    tgt = be.target(arch, emulated=bool(emu))
    prog = _program()
    try:
        art = cache.compile_cached(be, prog, tgt)
    except hk.interface.BackendError as e:
        pytest.skip(f"{spec} cannot compile here: {e}")
    again = cache.compile_cached(be, prog, tgt)
    assert again is not art and _fields(again) == _fields(art)
    if emu:                                       # the restored Artifact launches: x * 3 exactly
        x = torch.randn(32, 64)
        y = torch.full_like(x, float("nan"))
        be.launch(again, [x, y], (2, 2, 1))
        torch.testing.assert_close(y, (x.double() * 3).float(), rtol=0, atol=0)


def test_the_cache_module_has_no_pickle():
    src = Path(cache.__file__).read_text()
    assert not re.search(r"^\s*(import|from)\s+(c?pickle|marshal|shelve|dill)", src, re.M)


def test_a_value_that_is_not_data_is_not_cached(hip, tmp_path):
    art = Artifact("b", "t", "k", "h", launch={"fn": print})
    with pytest.raises(TypeError):
        cache.store("k" * 64, art)
    assert not _entries(tmp_path / "cache")


# ---------------------------------------------------------------------------------- damaged entries
def _compiled_entry(hip, tmp_path):
    be, tgt, calls = hip
    prog = _program()
    first = cache.compile_cached(be, prog, tgt)
    (entry,) = _entries(tmp_path / "cache")
    return be, tgt, calls, prog, first, entry


def test_corrupt_entries_are_recompiled(hip, tmp_path):
    be, tgt, calls, prog, first, entry = _compiled_entry(hip, tmp_path)
    good = entry.read_bytes()
    for k, damaged in enumerate([good[:-1] + bytes([good[-1] ^ 1]), good[:len(good) // 2], good[:len(cache.MAGIC)],
                                 b"", b"garbage", good.replace(b'"key": "', b'"key": "x', 1)]):
        entry.write_bytes(damaged)
        art = cache.compile_cached(be, prog, tgt)
        assert len(calls) == 2 + k, f"damaged entry {k} was not a miss"
        assert _fields(art) == _fields(first)
        assert entry.read_bytes() == good, "the entry is rewritten after compiling"


def _forge(meta, binary=b"abc") -> bytes:
    """An entry with a valid digest around whatever metadata: what someone able to write the file makes."""
    mb = json.dumps(meta).encode()
    rest = b"%d\n" % len(mb) + mb + binary
    return cache.MAGIC + hashlib.sha256(rest).hexdigest().encode() + b"\n" + rest


def test_an_entry_with_a_valid_digest_but_wrong_shape_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("HK_CACHE_DIR", str(tmp_path))
    key = "ab" + "0" * 62
    blob = cache.encode(key, Artifact("b", "t", "k", "h", binary=b"abc"))
    path = cache._path(key, tmp_path)
    path.parent.mkdir(mode=0o700)
    meta = json.loads(blob[len(cache.MAGIC) + 65:].split(b"\n", 1)[1][:-3])
    path.write_bytes(_forge(meta))
    assert cache.load(key) is not None                               # the forger's format is right ...
    assert cache.decode("other" + key[5:], blob) is None              # ... an entry moved to another key is not
    art = meta["artifact"]
    deep = "[" * 50000 + "]" * 50000
    for bad in ({**meta, "artifact": {"backend": "b"}},                                  # fields missing
                {**meta, "artifact": {**art, "launch": [1]}},                            # a wrong type
                {**meta, "artifact": {**art, "extra": 1}},                               # an unknown field
                {**meta, "artifact": {**art, "launch": {"__hk_bytes__": "!!"}}},         # bad base64
                {**meta, "binary": 4},                                                   # wrong length
                [1, 2, 3]):
        path.write_bytes(_forge(bad))
        assert cache.load(key) is None, bad
    mb = ('{"key": "%s", "binary": 3, "artifact": %s' % (key, deep)).encode()          # nested past any limit
    rest = b"%d\n" % len(mb) + mb + b"abc"
    path.write_bytes(cache.MAGIC + hashlib.sha256(rest).hexdigest().encode() + b"\n" + rest)
    assert cache.load(key) is None


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def test_a_planted_pickle_is_rejected_not_run(hip, tmp_path):
    be, tgt, calls, prog, first, entry = _compiled_entry(hip, tmp_path)
    proof = tmp_path / "proof"                    # the payload does run when unpickled: the test can fail
    pickle.loads(pickle.dumps(_Exploit(str(proof))))
    assert proof.read_text() == "pwned"
    marker = tmp_path / "marker"
    body = pickle.dumps(_Exploit(str(marker)))
    for planted in (hashlib.sha256(body).hexdigest().encode() + body,       # the old format, digest valid
                    cache.MAGIC + body, body):
        entry.write_bytes(planted)
        art = cache.compile_cached(be, prog, tgt)
        assert not marker.exists(), "reading the cache ran code"
        assert _fields(art) == _fields(first)
    assert len(calls) == 4 and entry.read_bytes().startswith(cache.MAGIC)


# ---------------------------------------------------------------------------------------- directories
def test_the_directory_is_created_0700(hip, tmp_path):
    be, tgt, _ = hip
    cache.compile_cached(be, _program(), tgt)
    root = tmp_path / "cache"
    assert (root.stat().st_mode & 0o777) == 0o700
    for d in root.iterdir():
        assert (d.stat().st_mode & 0o077) == 0
    for e in _entries(root):
        assert (e.stat().st_mode & 0o077) == 0


def _refused(hip, tmp_path, monkeypatch, why):
    """The cache directory (set up by the caller) is refused with a warning naming `why`, once; compiles are
    then served from memory and nothing is written. Starts from an empty memory cache and warning set."""
    be, tgt, calls = hip
    monkeypatch.setattr(cache, "_memory", {})
    monkeypatch.setattr(cache, "_warned", set())
    with pytest.warns(RuntimeWarning, match=why):
        art = cache.compile_cached(be, _program(), tgt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # warned once per directory
        again = cache.compile_cached(be, _program(), tgt)
    assert calls == [1], "refused directory: the second compile is served from memory"
    assert _fields(again) == _fields(art)
    assert not _entries(tmp_path / "cache"), "nothing is written into a refused directory"


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_directory_others_can_write_is_refused(hip, tmp_path, monkeypatch, mode):
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(mode)
    _refused(hip, tmp_path, monkeypatch, "writable by its group or by everyone")


def test_a_directory_owned_by_another_user_is_refused(hip, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(root, 12345, 12345)
    else:
        monkeypatch.setattr(cache.os, "geteuid", lambda: os.getuid() + 1)
    _refused(hip, tmp_path, monkeypatch, "owned by uid")


def test_a_symlinked_directory_is_refused(hip, tmp_path, monkeypatch):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    (tmp_path / "cache").symlink_to(real)
    _refused(hip, tmp_path, monkeypatch, "not a directory")
    assert not _entries(real)


def test_a_read_only_directory_still_compiles_and_serves_its_entries(hip, tmp_path, monkeypatch):
    be, tgt, calls = hip
    root = tmp_path / "cache"
    cache.compile_cached(be, _program(32), tgt)
    before = _entries(root)
    for d in [root, *root.iterdir()]:
        d.chmod(0o500)
    if os.geteuid() == 0:                         # root writes anyway: make the write fail as EACCES would
        def denied(*a, **k):
            raise PermissionError(errno.EACCES, "Permission denied")
        monkeypatch.setattr(cachefiles.tempfile, "mkstemp", denied)
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # a read-only directory is safe: no warning, no fallback
        hit = cache.compile_cached(be, _program(32), tgt)
        miss = cache.compile_cached(be, _program(64), tgt)
    assert hit.source and miss.source and calls == [1, 1]
    assert _entries(root) == before
    for d in [root, *root.iterdir()]:
        d.chmod(0o700)


def test_a_full_disk_leaves_no_partial_entry(hip, tmp_path, monkeypatch):
    be, tgt, calls = hip

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.os, "replace", full)
    art = cache.compile_cached(be, _program(), tgt)
    assert art.source and calls == [1]
    root = tmp_path / "cache"
    assert not _entries(root) and not [p for p in root.rglob(".tmp-*")]


# ---------------------------------------------------------------------------------------- concurrency
def _worker(args):
    """In a fresh process: compile_cached for one configuration; (compiles run, source digest, entry ok)."""
    cache_root, bn = args
    os.environ["HK_CACHE_DIR"] = cache_root
    be = registry.load("hip")
    real, calls = type(be).compile, []

    def counting(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    type(be).compile = counting
    art = cache.compile_cached(be, _program(bn), be.target("gfx942", emulated=False))
    return len(calls), bn, hashlib.sha256((art.source + (art.asm or "")).encode()).hexdigest()


def test_processes_compiling_the_same_and_different_kernels_at_once(tmp_path):
    root = str(tmp_path / "cache")
    jobs = [(root, bn) for bn in (32, 64, 32, 64)]
    ctx = multiprocessing.get_context("spawn")   # fresh interpreters: nothing shared but the directory
    with ctx.Pool(len(jobs)) as pool:
        results = pool.map(_worker, jobs, chunksize=1)
    digests = {}
    for _, bn, digest in results:
        digests.setdefault(bn, set()).add(digest)
    assert all(len(d) == 1 for d in digests.values()), "racing compiles of one kernel disagree"
    assert 2 <= sum(r[0] for r in results) <= len(jobs)
    entries = _entries(Path(root))
    assert len(entries) == 2 and not list(Path(root).rglob(".tmp-*"))
    with ctx.Pool(2) as pool:                      # every entry is whole: fresh processes all hit
        again = pool.map(_worker, [(root, 32), (root, 64)], chunksize=1)
    assert [r[0] for r in again] == [0, 0]
    assert all(r[2] in digests[r[1]] for r in again)
