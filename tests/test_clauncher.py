"""The compiled launcher (runtime/clauncher.c) on the CPU, against the Python forms it replaces: the same
parameter bytes as codegen/abi.py's struct format, the right arguments to the launch function (a C stub
compiled here records them), the same ArgumentError messages as the ctypes path, the same keys and grids
as the Python fast path, and the fallback with its reason where it cannot be built."""
from __future__ import annotations

import ctypes
import gc
import random
import struct
import weakref

import pytest
import torch

import hk_portable as hk
from hk_portable.backends.cuda import driver, tma
from hk_portable.codegen import abi
from hk_portable.interface import GL, RT, ArgumentError, BackendError, f32
from hk_portable.interface.backend import Artifact, Target
from hk_portable.interface.dtypes import bf16, f16, i32
from hk_portable.interface.ir import GlobalType, ScalarType
from hk_portable.runtime import clauncher
from hk_portable.runtime.launch import _grid3
from hk_portable.testing import fake_cuda


@pytest.fixture(scope="module")
def mod():
    return fake_cuda.compiled_or_skip(clauncher.load(), f"no compiled launcher here: {clauncher.reason()}")


# ------------------------------------------------------------------------------ a C stub of cuLaunchKernel
STUB = r"""
#include <stddef.h>
#include <string.h>
unsigned rec_grid[3], rec_block[3], rec_shared;
void *rec_func, *rec_stream, *rec_tags[3];
int rec_calls, rec_mode, rec_nptrs, ret_code;
size_t rec_size;
long long rec_offsets[64];
unsigned char rec_buf[8192];
int stub_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned shared, void *stream, void **params, void **extra) {
    rec_calls++;
    rec_func = f; rec_stream = stream; rec_shared = shared;
    rec_grid[0] = gx; rec_grid[1] = gy; rec_grid[2] = gz;
    rec_block[0] = bx; rec_block[1] = by; rec_block[2] = bz;
    if (extra) {
        rec_mode = 1;
        rec_tags[0] = extra[0]; rec_tags[1] = extra[2]; rec_tags[2] = extra[4];
        rec_size = *(size_t *)extra[3];
        memcpy(rec_buf, extra[1], rec_size);
    } else {
        rec_mode = 2;
        for (int i = 0; i < rec_nptrs; i++) rec_offsets[i] = (char *)params[i] - (char *)params[0];
        memcpy(rec_buf, params[0], rec_size);             /* rec_size: set by the test */
    }
    return ret_code;
}
"""


class Stub:
    """The compiled STUB: its launch function, that function's address, and what it recorded."""
    def __init__(self, lib):
        self.lib = lib
        self.launch = lib.stub_launch
        self.address = ctypes.cast(self.launch, ctypes.c_void_p).value

    def get(self, name, ctype=ctypes.c_int):
        return ctype.in_dll(self.lib, name)

    def array(self, name, ctype, n):
        return list((ctype * n).in_dll(self.lib, name))

    def bytes(self, n):
        return bytes((ctypes.c_ubyte * n).in_dll(self.lib, "rec_buf"))


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    cc = fake_cuda.compiled_or_skip(clauncher.compiler(), "no host C compiler")
    return Stub(fake_cuda.build_stub(cc, STUB, tmp_path_factory.mktemp("stub")))


# --------------------------------------------------------------------------------- (1) the packed bytes
def _random_case(rng: random.Random):
    """Random Program parameters and CPU arguments for them: tensors of rank 1-4 with random shapes and
    strides (views of one storage), int32 and float32 scalars at and inside their limits."""
    params, args = [], []
    for k in range(rng.randint(1, 7)):
        kind = rng.choice(["gl", "gl", "i32", "f32"])
        if kind == "gl":
            rank = rng.randint(1, 4)
            dtype = rng.choice([(bf16, torch.bfloat16), (f32, torch.float32), (f16, torch.float16)])
            shape = [rng.randint(0, 9) for _ in range(rank)]
            # an empty view may have any strides (int64 ones included); others stay inside a small storage
            big = 0 in shape
            stride = [rng.choice([0, 1, rng.randint(1, 2**40 if big else 5)]) for _ in range(rank)]
            offset = rng.randint(0, 15)
            need = offset + 1 + (0 if big else sum((n - 1) * st for n, st in zip(shape, stride)))
            base = torch.zeros(need, dtype=dtype[1])
            t = base.as_strided(shape, stride, storage_offset=offset) if rng.random() < 0.7 else \
                torch.zeros(*[min(s, 3) for s in shape], dtype=dtype[1])
            params.append((f"a{k}", GlobalType(dtype[0], t.dim())))
            args.append(t)
        elif kind == "i32":
            params.append((f"a{k}", ScalarType(i32)))
            args.append(rng.choice([0, -1, 2**31 - 1, -2**31, rng.randint(-2**31, 2**31 - 1)]))
        else:
            params.append((f"a{k}", ScalarType(f32)))
            args.append(rng.choice([0.0, -0.0, 1.5, 1e-45, 3.4e38, float("inf"), float("-inf"), rng.uniform(-1e6, 1e6),
                                    rng.randint(-100, 100)]))
    return params, args


def _launcher(mod, params, **kw):
    fmt, size, desc = abi.param_layout(params)
    return mod.Launcher(0, 1, 128, 0, abi.launcher_params(desc), size, -1, **kw), fmt, desc


def test_packed_bytes_are_the_abi_struct_format(mod):
    rng = random.Random(1234)
    for _ in range(300):
        params, args = _random_case(rng)
        L, fmt, desc = _launcher(mod, params)
        want = struct.pack(fmt, *abi.arg_values(params, args))
        assert L.pack(tuple(args)) == want
        assert L.pack(list(args)) == want
        # and what today's generated Python packer writes
        buf = bytearray(struct.calcsize(fmt))
        assert abi.make_packer([d["kind"] for d in desc], fmt)(args, buf, -1)
        assert bytes(buf) == want


def test_gl_offsets_match_the_struct_format():
    for rank in range(1, 5):
        fmt = abi.gl_format(rank)
        ptr, shape, stride = abi.gl_offsets(rank)
        vals = (0x1122334455667788, *range(1, rank + 1), *range(-1, -rank - 1, -1))
        raw = struct.pack(fmt, *vals)
        assert struct.unpack_from("<Q", raw, ptr)[0] == vals[0]
        assert list(struct.unpack_from(f"<{rank}i", raw, shape)) == list(range(1, rank + 1))
        assert list(struct.unpack_from(f"<{rank}q", raw, stride)) == list(range(-1, -rank - 1, -1))


def test_refusals_are_statuses(mod):
    params = [("x", GlobalType(f32, 2)), ("n", ScalarType(i32)), ("s", ScalarType(f32))]
    L, _, _ = _launcher(mod, params)
    x = torch.zeros(2, 3)
    refused = mod.LAUNCH_REFUSED
    assert L.pack((x, 1, 1.0)) != refused
    assert L.pack((x, 1)) == refused                                     # wrong count
    assert L.pack((x.to("meta").unsqueeze(0), 1, 1.0)) == refused        # wrong rank
    assert L.pack((x, 2**31, 1.0)) == refused                            # int32 overflow of a scalar
    assert L.pack((x, -2**31 - 1, 1.0)) == refused
    assert L.pack((x, 1.5, 1.0)) == refused                              # not an int
    assert L.pack((x, 1, "s")) == refused                                # not a float
    assert L.pack((x, 1, 1e300)) == refused                              # float32 overflow ('<f' refuses it too)
    assert L.pack((torch.zeros(1, 1).expand(2**31, 1), 1, 1.0)) == refused   # int32 overflow of a shape
    assert L.pack((object(), 1, 1.0)) == refused                         # not a tensor
    _, size, desc = abi.param_layout(params)
    on_cuda0 = mod.Launcher(0, 1, 128, 0, abi.launcher_params(desc), size, 0)
    assert on_cuda0.pack((x, 1, 1.0)) == refused                         # a CPU tensor where cuda:0 is expected


class Boom(Exception):
    pass


def test_python_exceptions_other_than_refusals_propagate(mod):
    class Odd(torch.Tensor):
        def data_ptr(self):
            raise Boom
    L, _, _ = _launcher(mod, [("x", GlobalType(f32, 2))])
    with pytest.raises(Boom):
        L.pack((torch.zeros(2, 2).as_subclass(Odd),))


# ------------------------------------------------------------------------------- (2) the launch call
def test_the_launch_function_gets_the_call(mod, stub):
    params = [("x", GlobalType(bf16, 2)), ("y", GlobalType(f32, 3)), ("n", ScalarType(i32)), ("s", ScalarType(f32))]
    fmt, size, desc = abi.param_layout(params)
    L = mod.Launcher(0xABC0, stub.address, 256, 4096, abi.launcher_params(desc), size, -1,
                     stream_fn=lambda dev: 0x5000 + dev)
    x = torch.zeros(7, 9, dtype=torch.bfloat16)[:, 1:]
    y = torch.zeros(2, 3, 4).transpose(0, 2)
    assert L((x, y, -5, 2.5), (3, 2, 1), 0x1234) is None
    assert stub.array("rec_grid", ctypes.c_uint, 3) == [3, 2, 1]
    assert stub.array("rec_block", ctypes.c_uint, 3) == [256, 1, 1]
    assert stub.get("rec_shared", ctypes.c_uint).value == 4096
    assert stub.get("rec_func", ctypes.c_void_p).value == 0xABC0
    assert stub.get("rec_stream", ctypes.c_void_p).value == 0x1234
    assert stub.get("rec_mode").value == 1                               # `extra`, CUDA's markers
    assert [v or 0 for v in stub.array("rec_tags", ctypes.c_void_p, 3)] == [1, 2, 0]
    assert stub.get("rec_size", ctypes.c_size_t).value == size
    assert stub.bytes(size) == struct.pack(fmt, *abi.arg_values(params, [x, y, -5, 2.5]))
    L((x, y, 1, 1.0), (1, 1, 1), None)                                   # None: the stream function's stream
    assert stub.get("rec_stream", ctypes.c_void_p).value == 0x5000 - 1
    stub.get("ret_code").value = 700                                     # a driver error is returned as is
    try:
        assert L((x, y, 1, 1.0), (1, 1, 1), 0) == 700
    finally:
        stub.get("ret_code").value = 0


def test_kernel_params_form_and_tail(mod, stub):
    """Kernels with tensor maps: kernelParams (a pointer per parameter, map and flag into the one buffer),
    the tail written after the parameters and reused while the packed parameters are the same."""
    params = [("a", GlobalType(bf16, 2)), ("n", ScalarType(i32))]
    fmt, size, desc = abi.param_layout(params)
    first, flag, total = tma.layout(size, 2)
    offsets = [d["offset"] for d in desc] + [first, first + 128, flag]
    calls = []

    def tail(args):
        calls.append(args[0].data_ptr())
        return bytes([7]) * 256 + (1).to_bytes(4, "little")

    L = mod.Launcher(1, stub.address, 128, 0, abi.launcher_params(desc), total, -1, use_params=True,
                     ptr_offsets=offsets, tail_fn=tail, tail_offset=first)
    stub.get("rec_nptrs").value = len(offsets)
    stub.get("rec_size", ctypes.c_size_t).value = total
    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    L((a, 3), (1, 1, 1), 0)
    assert stub.get("rec_mode").value == 2
    assert stub.array("rec_offsets", ctypes.c_longlong, len(offsets)) == offsets
    got = stub.bytes(total)
    assert got[:size] == struct.pack(fmt, *abi.arg_values(params, [a, 3]))
    assert got[size:first] == bytes(first - size)
    assert got[first:] == bytes([7]) * 256 + (1).to_bytes(4, "little")
    L((a, 3), (1, 1, 1), 0)
    assert len(calls) == 1                                               # the same parameters: the cached tail
    L((a, 4), (1, 1, 1), 0)
    L((a[1:], 4), (1, 1, 1), 0)
    assert len(calls) == 3


ENCODE_STUB = r"""
#include <stdint.h>
#include <string.h>
/* cuTensorMapEncodeTiled's signature: the map records every input; an innermost dim of 24 is refused */
int hk_stub_encode(void *tm, int dtype, unsigned rank, void *addr, const uint64_t *dims, const uint64_t *strides,
                   const uint32_t *box, const uint32_t *es, int il, int sw, int l2, int oob) {
    uint64_t *o = tm;
    if (dims[0] == 24) return 1;
    memset(tm, 0, 128);
    o[0] = (uint64_t)dtype | (uint64_t)rank << 8 | (uint64_t)il << 16 | (uint64_t)sw << 24 | (uint64_t)l2 << 32
           | (uint64_t)oob << 40;
    o[1] = (uint64_t)(uintptr_t)addr;
    for (unsigned k = 0; k < rank; k++) {
        o[2 + k] = dims[k];
        o[11 + k] = (uint64_t)box[k] << 32 | es[k];
        if (k + 1 < rank) o[7 + k] = strides[k];
    }
    return 0;
}
"""


@pytest.fixture
def stub_encoder(tmp_path, monkeypatch):
    """cuTensorMapEncodeTiled replaced by ENCODE_STUB (built with the host C compiler) for tma.py and the launcher."""
    cc = clauncher.compiler()
    if cc is None:
        pytest.skip("no host C compiler")
    enc = fake_cuda.build_stub(cc, ENCODE_STUB, tmp_path).hk_stub_encode
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    enc.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    enc.restype = ctypes.c_int
    monkeypatch.setattr(tma, "_encoder", lambda: enc)
    return enc


def test_the_launcher_encodes_the_tensor_maps_python_would(mod, stub_encoder):
    """A launch whose tensors changed encodes its TMA maps in C (clauncher.c encode_map), not through
    TensorMaps.tail: the same bytes as tail() for every case describe() distinguishes (a read map refused zeroes
    the tail, a written one clears the stores bit), with cuTensorMapEncodeTiled a stub recording its inputs."""
    params = [("q", GlobalType(bf16, 4)), ("k", GlobalType(bf16, 3)), ("o", GlobalType(bf16, 2)),
              ("n", ScalarType(i32))]
    fmt, size, desc = abi.param_layout(params)
    specs = [dict(param=0, rank=4, dtype="bf16", box_rows=64, box_cols=64),
             dict(param=1, rank=3, dtype="bf16", box_rows=32, box_cols=64),
             dict(param=2, rank=2, dtype="bf16", box_rows=128, box_cols=64, store=True)]
    maps = tma.TensorMaps(specs, size)
    python_tails = []
    L = mod.Launcher(1, 1, 128, 0, abi.launcher_params(desc), maps.size, -1,
                     tail_fn=lambda args: python_tails.append(args) or maps.tail(args), tail_offset=maps.first,
                     tmaps=maps.c_specs(desc), encode=tma.encoder_address())
    base = torch.zeros(1 << 16, dtype=torch.bfloat16)
    q = base[:2 * 3 * 40 * 64].view(2, 3, 40, 64)
    k = base[:5 * 16 * 64].view(5, 16, 64)
    o = base[:100 * 128].view(100, 128)
    cases = {"all encoded": (q, k, o), "a read map not unit-stride": (q, k.transpose(1, 2), o),
             "a read map misaligned": (q, base[1:1 + 5 * 16 * 64].view(5, 16, 64), o),
             "a read map's row stride not 16-byte": (q, base[:5 * 16 * 68].view(5, 16, 68)[..., :60], o),
             "a written map refused": (q, k, o.t()),
             "the driver refuses a read map": (q, base[:5 * 16 * 24].view(5, 16, 24), o),
             "the driver refuses the written map": (q, k, base[:100 * 24].view(100, 24))}
    for name, (a, b, c) in cases.items():
        args = (a, b, c, 7)
        packed = L.pack(args)
        assert isinstance(packed, bytes), name
        want = maps.tail(args)
        assert packed[maps.first:maps.first + len(want)] == want, name
        flag = int.from_bytes(want[-4:], "little")
        assert flag == {"all encoded": 3, "a written map refused": 1, "the driver refuses the written map": 1}.get(
            name, 0), name
    assert not python_tails                                              # every tail was C's
    assert maps.c_specs([{**d, "rank": 9} for d in desc]) is None      # a rank the parameter lacks: tail()'s path


def test_the_launcher_encodes_reduce_maps_as_viewed_or_transposed(mod, stub_encoder):
    """The two maps of a TMA reduce-add (tma_writes.reduces) on one f32 parameter: as the parameter views the
    tensor (flag bit 4) and of the tensor a transposed view views (bit 8, its last two dimensions swapped back). C
    encodes what tail() does: a contiguous accumulator sets bit 4, its transposed view bit 8 (the map then describes
    the contiguous tensor: same dims and strides as the first), a view neither describes clears both and keeps the
    read maps (the kernel adds from shared memory)."""
    from hk_portable.backends.cuda.dataflow import TmaLoad
    params = [("q", GlobalType(bf16, 4)), ("acc", GlobalType(f32, 4))]
    fmt, size, desc = abi.param_layout(params)
    reduce = dict(param=1, rank=4, dtype="f32", box_rows=64, box_cols=32, store=True, reduce=True)
    specs = [dict(param=0, rank=4, dtype="bf16", box_rows=64, box_cols=64),
             TmaLoad(**reduce).to_json(), TmaLoad(**reduce, transpose=True).to_json()]
    maps = tma.TensorMaps(specs, size)
    L = mod.Launcher(1, 1, 128, 0, abi.launcher_params(desc), maps.size, -1, tail_fn=lambda args: maps.tail(args),
                     tail_offset=maps.first, tmaps=maps.c_specs(desc), encode=tma.encoder_address())
    q = torch.zeros(2, 3, 40, 64, dtype=torch.bfloat16)
    acc = torch.zeros(2, 3, 40, 128)
    cases = {"contiguous": (acc, 1 | 4), "transposed view": (acc.transpose(-1, -2), 1 | 8),
             "neither": (acc[..., ::2], 1)}
    for name, (a, want_flag) in cases.items():
        args = (q, a)
        want = maps.tail(args)
        packed = L.pack(args)
        assert packed[maps.first:maps.first + len(want)] == want, name
        assert int.from_bytes(want[-4:], "little") == want_flag, name
    t = maps.tail((q, acc.transpose(-1, -2)))
    assert t[2 * 128:3 * 128] == maps.tail((q, acc))[128:2 * 128]          # the viewed tensor's map, as viewed


def test_persistent_kernels_get_their_logical_grid(mod, stub):
    """A persistent kernel: the logical grid goes into the parameters after the tail, and the launch runs
    min(its tiles, max_blocks) blocks on one axis."""
    params = [("a", GlobalType(bf16, 2))]
    fmt, size, desc = abi.param_layout(params)
    first, flag, total = tma.layout(size, 1)
    offsets = [d["offset"] for d in desc] + [first, flag] + [total + 4 * i for i in range(3)]
    L = mod.Launcher(1, stub.address, 384, 0, abi.launcher_params(desc), total + 12, -1, use_params=True,
                     ptr_offsets=offsets, tail_fn=lambda args: bytes(128) + (1).to_bytes(4, "little"),
                     tail_offset=first, grid_offset=total, max_blocks=132)
    stub.get("rec_nptrs").value = len(offsets)
    stub.get("rec_size", ctypes.c_size_t).value = total + 12
    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    for grid, launched in (((32, 16, 4), 132), ((5, 2, 3), 30), ((1, 1, 1), 1)):
        L((a,), grid, 0)
        assert stub.array("rec_grid", ctypes.c_uint, 3) == [launched, 1, 1]
        assert struct.unpack_from("<3i", stub.bytes(total + 12), total) == grid
    with pytest.raises(ValueError, match="persistent grid"):
        mod.Launcher(1, stub.address, 384, 0, abi.launcher_params(desc), total, -1, grid_offset=total, max_blocks=1)


def test_statuses_reach_on_status(mod, stub):
    params = [("x", GlobalType(f32, 1))]
    fmt, size, desc = abi.param_layout(params)
    seen = []
    L = mod.Launcher(1, stub.address, 32, 0, abi.launcher_params(desc), size, -1,
                     on_status=lambda st, args, grid, stream: seen.append((st, grid, stream)) or "handled")
    x = torch.zeros(3)
    assert L((x,), (1, 70000, 1), 0) == "handled"
    assert L((x,), (1, 1, 1), object()) == "handled"
    assert L((x,), (1, 1, 1), None) == "handled"                         # no stream function
    assert L((x, x), (1, 1, 1), 0) == "handled"
    assert [s for s, _, _ in seen] == [mod.GRID_REFUSED, mod.STREAM_NOT_A_HANDLE, mod.STREAM_NOT_A_HANDLE,
                                       mod.LAUNCH_REFUSED]


# ------------------------------------------------------------- (3) a LaunchPlan's errors on both paths
PARAMS = [("x", GlobalType(bf16, 2)), ("y", GlobalType(f32, 3)), ("n", ScalarType(i32)), ("s", ScalarType(f32))]


def _plan(monkeypatch, stub, compiled: bool, device_index: int = -1):
    """A LaunchPlan on the fake driver (CPU tensors are on device -1), with or without the compiled launcher."""
    monkeypatch.setattr(driver, "cudrv", fake_cuda.FakeCudrv(stub.launch))
    fmt, size, params = abi.param_layout(PARAMS)
    params[1]["stored"] = True                          # y: an output, as the backend marks one it stores to
    art = Artifact(backend="cuda", target="sm_90a", kernel_name="k", program_hash="0", binary=b"cubin",
                   launch={"threads": 128, "shared_bytes": 0, "params": params, "param_format": fmt,
                           "param_size": size})
    with pytest.MonkeyPatch.context() as m:
        if not compiled:
            m.setattr(clauncher, "load", lambda build_if_missing=True: None)
        plan = driver.LaunchPlan(art, device_index=device_index)
    assert (plan.c_launch is not None) == compiled
    return plan


BAD_CALLS = {
    "wrong device": lambda x, y: ([x, y, 1, 1.0], (1, 1, 1), 0),           # on a plan for cuda:0
    "shape beyond int32": lambda x, y: ([torch.zeros(1, 1, dtype=torch.bfloat16).expand(2**31, 1), y, 1, 1.0],
                                        (1, 1, 1), 0),
    "int32 scalar overflow": lambda x, y: ([x, y, 2**31, 1.0], (1, 1, 1), 0),
    "wrong count": lambda x, y: ([x, y, 1], (1, 1, 1), 0),
    "not a tensor": lambda x, y: ([3, y, 1, 1.0], (1, 1, 1), 0),
    "wrong rank": lambda x, y: ([x, x, 1, 1.0], (1, 1, 1), 0),
    "grid": lambda x, y: ([x, y, 1, 1.0], (1, 70000, 1), 0),
    "stream": lambda x, y: ([x, y, 1, 1.0], (1, 1, 1), object()),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_errors_are_the_python_paths(case, mod, stub, monkeypatch):
    x, y = torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(2, 2, 2)
    messages = []
    args, grid, stream = BAD_CALLS[case](x, y)
    for compiled in (True, False):
        plan = _plan(monkeypatch, stub, compiled, device_index=0 if case == "wrong device" else -1)
        before = stub.get("rec_calls").value
        with pytest.raises(ArgumentError) as e:
            plan.launch(args, grid, stream, "k")
        assert stub.get("rec_calls").value == before, "a refused launch reached the driver"
        messages.append(str(e.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("shared", [lambda y: y[:, :, :1].expand(2, 2, 2),
                                    lambda y: torch.zeros(8).as_strided((2, 2, 2), (2, 1, 1))])
def test_the_compiled_launcher_refuses_an_output_whose_elements_share_memory(shared, mod, stub, monkeypatch):
    """Kernel.__call__ checks outputs before the Python launch; the compiled fast path launches without
    Python, so its launcher refuses such an output itself and the plan explains it in check_outputs' words."""
    plan = _plan(monkeypatch, stub, True)
    before = stub.get("rec_calls").value
    y = shared(torch.zeros(2, 2, 2))
    with pytest.raises(ArgumentError, match="k: output 'y' .* has a zero or overlapping stride"):
        plan.launch([torch.zeros(4, 4, dtype=torch.bfloat16), y, 1, 1.0], (1, 1, 1), 0, "k")
    assert stub.get("rec_calls").value == before, "a refused launch reached the driver"
    plan.launch([torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(2, 2, 2).transpose(0, 2), 1, 1.0],
                (1, 1, 1), 0, "k")
    assert stub.get("rec_calls").value == before + 1


def test_wrong_device_message_names_the_device(mod, stub, monkeypatch):
    plan = _plan(monkeypatch, stub, True, device_index=0)
    with pytest.raises(ArgumentError, match="'x' must be a CUDA tensor, got cpu"):
        plan.launch([torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(2, 2, 2), 1, 1.0], (1, 1, 1), 0, "k")


def test_a_driver_error_is_a_backend_error_on_both_paths(mod, stub, monkeypatch):
    x, y = torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(2, 2, 2)
    messages = []
    stub.get("ret_code").value = 701
    try:
        for compiled in (True, False):
            plan = _plan(monkeypatch, stub, compiled)
            with pytest.raises(BackendError, match="cuLaunchKernel failed: CUDA_ERROR_701") as e:
                plan.launch([x, y, 1, 1.0], (2, 1, 1), 0, "k")
            messages.append(str(e.value))
    finally:
        stub.get("ret_code").value = 0
    assert messages[0] == messages[1]


def test_a_stream_object_is_resolved(mod, stub, monkeypatch):
    plan = _plan(monkeypatch, stub, True)

    class S:
        cuda_stream = 0x7777
    plan.launch([torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(2, 2, 2), 1, 1.0], (1, 1, 1), S(), "k")
    assert stub.get("rec_stream", ctypes.c_void_p).value == 0x7777


def test_a_plan_and_its_launcher_are_collected(mod, stub, monkeypatch):
    plan = _plan(monkeypatch, stub, True)
    ref = weakref.ref(plan)
    del plan
    gc.collect()
    assert ref() is None, "the plan -> launcher -> bound on_status cycle is not collectable"


# ------------------------------------------------------------------ the fast path's key and grid forms
def test_signature_is_the_python_key(mod):
    x = torch.zeros(2, 3)
    cases = [(x, x.to(torch.bfloat16), 3, 2.5), (x.to("meta"), x), (torch.nn.Parameter(x), True, None), (),
             (x.unsqueeze(0), "s", b"b", 1 << 40)]
    for args in cases:
        assert mod.signature(args) == clauncher._py_signature(args)
        assert mod.signature(list(args)) == clauncher._py_signature(args)
    assert mod.signature((x,)) != mod.signature((x.to("meta"),))
    assert mod.signature((1,)) != mod.signature((True,))


def test_fastcall_key_is_the_python_key(mod, monkeypatch):
    monkeypatch.setattr(clauncher, "signature", clauncher._py_signature)    # call_key all in Python
    x = torch.zeros(2, 3)
    be = object()
    calls = [((x, 3), {}, None, None), ((x,), {"B": 16, "C": (1, 2)}, "cuda", "sm_90a"), ((x,), {}, be, None),
             ((x.to("meta"), 2.5), {"B": 1}, None, Target(backend="cuda", arch="sm_80"))]

    def check():
        for args, kwargs, backend, target in calls:
            got = mod.fastcall({}, len(args), args, kwargs, backend, target, None, 1)
            assert got == [clauncher.call_key(args, kwargs, backend, target)]
    check()
    with hk.use_backend("reference"):
        check()
    monkeypatch.setenv("HK_BACKEND", "reference")
    check()
    assert mod.fastcall({}, 1, (x,), {}, None, None, None, 1) == [clauncher.call_key((x,), {}, None, None)]
    for args, kwargs, backend, target in calls:                                  # the Python form's key too
        assert clauncher._py_fastcall({}, len(args), args, kwargs, backend, target, None, 1) == \
            mod.fastcall({}, len(args), args, kwargs, backend, target, None, 1)
    assert mod.fastcall({}, 2, (x,), {}, None, None, None, 1) is False            # wrong argument count
    assert mod.fastcall({}, 1, (x,), {"B": [1]}, None, None, None, 1) is False    # an unhashable const


def test_fastcall_leaves_to_python_what_it_does_not_launch(mod):
    x = torch.zeros(2, 3)
    key = mod.fastcall({}, 1, (x,), {}, None, None, None, 1)[0]
    launched = []
    hit_py = ("be", "art", None)
    assert mod.fastcall({key: hit_py}, 1, (x,), {}, None, None, None, 1) is hit_py       # no fast_launch
    hit = ("be", "art", lambda args, grid, stream: launched.append((args, grid, stream)))
    table = {key: hit}
    assert mod.fastcall(table, 1, (x,), {}, None, None, "s", (2, 3)) is None
    assert launched == [((x,), (2, 3, 1), "s")]
    for grid in ((0, 3), (True, 1), [2], -1):                                   # empty or not plain: Python's
        assert mod.fastcall(table, 1, (x,), {}, None, None, None, grid) is hit
    assert len(launched) == 1


@pytest.mark.parametrize("grid", [1, 7, (2,), (2, 3), (2, 3, 4), 0, (0, 1), (2**31 - 1, 1, 1), True, (True, 2),
                                  (1, False), -1, (1, -2), 2**31, (1, 2, 3, 4), (), [2, 3], "x", (1.0,), None])
def test_grid3_agrees_with_the_python_check(mod, grid):
    got = mod.grid3(grid)
    try:
        want = _grid3(grid)
    except ArgumentError:
        assert got is None
        return
    assert got is None or got == want


# ----------------------------------------------------------------------------- Kernel.__call__, end to end
@hk.kernel(num_warps=4)
def scaled(x: GL[2], y: GL[2], n: int, s: float, *, B: hk.const = 16):
    t = hk.load(RT[f32, B, B], x, (hk.block_idx(0), 0)) * s
    hk.store(y, t * n.to(f32), (hk.block_idx(0), 0))


@pytest.mark.parametrize("compiled", [True, False])
def test_kernel_call_through_the_fast_path(compiled, mod, stub, monkeypatch):
    fake_cuda.install(fake_cuda.FakeCudrv(stub.launch), raw_stream=lambda dev: 0x99, monkeypatch=monkeypatch)
    if not compiled:                       # all of it in Python, as without a compiler
        monkeypatch.setattr(clauncher, "load", lambda build_if_missing=True: None)
        monkeypatch.setattr(clauncher, "fastcall", clauncher._py_fastcall)
        monkeypatch.setattr(clauncher, "signature", clauncher._py_signature)
    be = fake_cuda.CpuCudaBackend()
    x, y = torch.randn(32, 16), torch.empty(32, 16)
    fmt, size, _ = abi.param_layout([("x", GlobalType(f32, 2)), ("y", GlobalType(f32, 2)), ("n", ScalarType(i32)),
                                     ("s", ScalarType(f32))])
    for n in (3, 4):                       # the first call takes the slow path, the second the fast one
        before = stub.get("rec_calls").value
        scaled(x, y, n, 0.5, grid=(2,), backend=be)
        assert stub.get("rec_calls").value == before + 1
        assert stub.bytes(size) == struct.pack(fmt, x.data_ptr(), 32, 16, 16, 1, y.data_ptr(), 32, 16, 16, 1, n, 0.5)
        assert stub.get("rec_stream", ctypes.c_void_p).value == 0x99
    (hit,) = [v for v in scaled._launches.values() if v[0] is be]
    assert (hit[2] is not None) == compiled
    before = stub.get("rec_calls").value
    for shared in (y[:, :1].expand(32, 16), y.as_strided((32, 16), (1, 1))):   # same signature, shared elements
        with pytest.raises(ArgumentError, match=r"output 'y' \(shape \(32, 16\), stride .*share memory"):
            scaled(x, shared, 3, 0.5, grid=(2,), backend=be)
    scaled(x, torch.empty(16, 32).t(), 3, 0.5, grid=(2,), backend=be)            # transposed: distinct, launched
    assert stub.get("rec_calls").value == before + 1
    with pytest.raises(ArgumentError, match="argument 'n' must be an int32 Python int, got 2147483648"):
        scaled(x, y, 2**31, 0.5, grid=(2,), backend=be)
    with pytest.raises(ArgumentError, match="argument 'n' must be an int32 Python int"):
        scaled(x, y, 2**31, 0.5, grid=(1, 70000), backend=be)      # the scalar's error first, as before
    with pytest.raises(ArgumentError, match="65535"):
        scaled(x, y, 1, 0.5, grid=(1, 70000), backend=be)
    with pytest.raises(ArgumentError, match="grid"):
        scaled(x, y, 1, 0.5, grid=(1, True), backend=be)
    before = stub.get("rec_calls").value
    scaled(x, y, 1, 0.5, grid=(0, 2), backend=be)                 # an empty grid launches nothing
    with pytest.raises(ArgumentError, match="int32"):
        scaled(x, y, 2**31, 0.5, grid=0, backend=be)               # but still checks the scalars
    assert stub.get("rec_calls").value == before


# --------------------------------------------------------------------------------------- (4) fallback
@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """clauncher with no module loaded and an empty cache directory; restored afterwards."""
    saved = {k: getattr(clauncher, k) for k in ("_module", "_reason", "_path", "signature", "fastcall")}
    monkeypatch.setenv("HK_CACHE_DIR", str(tmp_path / "cache"))
    clauncher.reset()
    yield tmp_path
    for k, v in saved.items():
        setattr(clauncher, k, v)


def test_no_compiler_means_the_python_path_with_a_reason(fresh, monkeypatch, stub):
    monkeypatch.setattr(clauncher, "compiler", lambda: None)
    assert clauncher.load() is None
    assert "no host C compiler" in clauncher.reason()
    assert clauncher.signature is clauncher._py_signature and clauncher.fastcall is clauncher._py_fastcall
    assert "Python launcher (ctypes)" in clauncher.describe() and "no host C compiler" in clauncher.describe()
    plan = _plan(monkeypatch, stub, compiled=False)
    x, y = torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(2, 2, 2)
    plan.launch([x, y, 1, 1.0], (1, 1, 1), 0, "k")                   # the ctypes path launches
    assert stub.get("rec_mode").value == 1


def test_no_headers_or_a_failing_build_is_a_reason(fresh, monkeypatch):
    monkeypatch.setattr(clauncher, "python_include", lambda: None)
    assert clauncher.load() is None and "Python.h" in clauncher.reason()
    clauncher.reset()
    monkeypatch.undo()
    monkeypatch.setenv("HK_CACHE_DIR", str(fresh / "cache2"))
    monkeypatch.setenv("CC", "false")
    assert clauncher.load() is None and "failed" in clauncher.reason()


def test_disabled_by_the_environment(fresh, monkeypatch):
    monkeypatch.setenv("HK_C_LAUNCHER", "0")
    assert clauncher.load() is None and "HK_C_LAUNCHER=0" in clauncher.reason()


def test_built_once_then_loaded_from_the_cache(fresh, monkeypatch):
    if clauncher.compiler() is None or clauncher.python_include() is None:
        pytest.skip("no compiler or Python headers")
    m = clauncher.load()
    assert m is not None and clauncher.path().is_file()
    assert clauncher.path().parent == fresh / "cache" / "launcher"
    clauncher.reset()
    monkeypatch.setattr(clauncher, "compiler", lambda: None)     # a warm cache needs no compiler
    assert clauncher.load() is not None
    assert clauncher.load(build_if_missing=False) is not None


def test_build_if_missing_false_never_compiles(fresh, monkeypatch):
    monkeypatch.setattr(clauncher, "build", lambda dest: pytest.fail("compiled"))
    assert clauncher.load(build_if_missing=False) is None
    assert clauncher.reason() is None                             # not a failure: a later load() may build
