"""The host side of the hip backend that runs without AMD hardware: arch names, the kernel argument
layout (against the compiled kernels' own metadata), and driver.py's calls and error paths with
hip-python replaced by a fake."""
from __future__ import annotations

import ctypes
import types

import pytest
import torch

from hk_portable.backends.hip import HipBackend, compiler, driver, hipapi
from hk_portable.codegen import abi
from hk_portable.interface.errors import BackendError
from hk_portable.kernels import attention, gemm, layernorm


@pytest.mark.parametrize("name,arch", [("gfx942:sramecc+:xnack-", "gfx942"), (b"gfx950:sramecc+:xnack-\0\0", "gfx950"),
                                       ("gfx942", "gfx942"), (" gfx90a:xnack+ ", "gfx90a")])
def test_parse_arch(name, arch):
    assert driver.parse_arch(name) == arch


def test_parse_arch_rejects_garbage():
    with pytest.raises(driver.HipError, match="gcnArchName"):
        driver.parse_arch("sm_90")


@pytest.mark.parametrize("rank,size", [(1, 24), (2, 32), (3, 48), (4, 56)])
def test_gl_layout(rank, size):
    assert abi.gl_size(rank) == size == ctypes.sizeof(abi.gl_struct(rank))


def _programs():
    out = []
    for mod, kern in ((gemm, gemm.gemm_kernel), (attention, attention.attention_fwd_kernel),
                      (layernorm, layernorm.dropout_residual_layernorm_kernel)):
        args, consts = mod.example_args()
        out.append(kern.trace(*args, **consts))
    return out


@pytest.mark.skipif(not compiler.available()[0], reason=compiler.available()[1])
@pytest.mark.parametrize("program", _programs(), ids=lambda p: p.name)
def test_argument_offsets_match_the_compiled_kernel(program):
    be = HipBackend()
    art = be.compile(program, be.target("gfx942"))
    meta = [(a["offset"], a["size"]) for a in art.resources["args"]]
    assert meta == abi.offsets(program.params)


def test_device_struct_packs_tensors_and_scalars():
    args, consts = layernorm.example_args()
    prog = layernorm.dropout_residual_layernorm_kernel.trace(*args, **consts)
    s = driver.device_struct(prog.params, args)
    raw = bytes(s)
    x = args[0]
    off = abi.offsets(prog.params)
    assert int.from_bytes(raw[off[0][0]:off[0][0] + 8], "little") == x.data_ptr()
    assert s.a0.shape[0] == x.shape[0] and s.a0.stride[0] == x.stride(0)
    assert s.a8.value if hasattr(s.a8, "value") else s.a8 == args[8]


# ------------------------------------------------------------------------------- a fake hip-python
class _Err(int):
    @property
    def value(self):
        return int(self)

    @property
    def name(self):
        return "hipSuccess" if self == 0 else f"hipError{int(self)}"


class FakeHip:
    """Records calls; returns what real hip-python returns: (error, *results)."""

    def __init__(self, count=1, arch=b"gfx942:sramecc+:xnack-", fail=None):
        self.calls, self.count, self.arch, self.fail = [], count, arch, fail or {}

    def _r(self, name, *res):
        self.calls.append(name)
        return (_Err(self.fail.get(name, 0)),) + res

    def hipGetDeviceCount(self):
        return self._r("hipGetDeviceCount", self.count)

    def hipGetDevice(self):
        return self._r("hipGetDevice", 0)

    def hipDeviceProp_t(self):
        return types.SimpleNamespace(gcnArchName=self.arch, name=b"AMD Instinct MI300X")

    def hipGetDeviceProperties(self, props, dev):
        return self._r("hipGetDeviceProperties")

    def hipGetErrorString(self, err):
        return b"fake error"

    def hipModuleLoadData(self, code):
        self.code = code
        return self._r("hipModuleLoadData", "module")

    def hipModuleGetFunction(self, module, name):
        self.fn_name = name
        return self._r("hipModuleGetFunction", "fn")

    def hipModuleLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shmem, stream, params, extra=None):
        self.launch = (fn, (gx, gy, gz), (bx, by, bz), shmem, stream, params, extra)
        return self._r("hipModuleLaunchKernel")


class FakeHiprtc:
    def __init__(self, ok=True):
        self.ok, self.opts = ok, None

    def hiprtcCreateProgram(self, src, name, n, headers, names):
        return (_Err(0), "prog")

    def hiprtcCompileProgram(self, prog, n, opts):
        self.opts = opts
        return (_Err(0 if self.ok else 6),)

    def hiprtcGetProgramLogSize(self, prog):
        return (_Err(0), 12)

    def hiprtcGetProgramLog(self, prog, buf):
        buf[:] = b"error: oops\0"
        return (_Err(0),)

    def hiprtcGetCodeSize(self, prog):
        return (_Err(0), 4)

    def hiprtcGetCode(self, prog, buf):
        buf[:] = b"\x7fELF"
        return (_Err(0),)

    def hiprtcDestroyProgram(self, prog):
        return (_Err(0),)


@pytest.fixture
def fake(monkeypatch):
    def install(hip=None, hiprtc=None):
        hip = hip or FakeHip()
        hiprtc = hiprtc or FakeHiprtc()
        monkeypatch.setattr(hipapi, "hip", lambda: hip)
        monkeypatch.setattr(hipapi, "hiprtc", lambda: hiprtc)
        monkeypatch.setattr(driver, "_probe", None)
        monkeypatch.setattr(driver, "_functions", {})
        return hip, hiprtc
    yield install
    driver.probe(refresh=True)


def test_probe_without_rocm_says_why():
    p = driver.probe(refresh=True)
    if p.available:
        pytest.skip("a ROCm device is present")
    assert p.reason.startswith(("no ROCm runtime", "hip-python is not installed"))
    st = HipBackend().status()
    assert not st.available and "no ROCm runtime" in st.reason


def test_probe_with_a_device(fake):
    fake(FakeHip(arch=b"gfx950:sramecc+:xnack-"))
    p = driver.probe()
    assert p.available and p.arch == "gfx950" and "MI300X" in p.device
    ts = HipBackend().targets()
    assert ts[0].arch == "gfx950" and not ts[0].compile_only and not ts[0].emulated and ts[0].has("run")
    assert [t.arch for t in ts if t.compile_only] == ["gfx942"]


def test_probe_failures(fake):
    fake(FakeHip(count=0))
    assert "no AMD GPU" in driver.probe().reason
    fake(FakeHip(fail={"hipGetDeviceCount": 100}))
    assert driver.probe().reason.startswith("no ROCm runtime: hipGetDeviceCount failed: hipError100")
    fake(FakeHip(arch=b"gfx90a:xnack-"))
    p = driver.probe()
    assert not p.available and "gfx90a" in p.reason and "gfx942" in p.reason


def test_dlopen_failure_is_reported(fake, monkeypatch):
    hip = FakeHip()
    hip.hipGetDeviceCount = lambda: (_ for _ in ()).throw(RuntimeError("failed to dlopen 'libamdhip64.so'"))
    fake(hip)
    assert driver.probe().reason == "no ROCm runtime: RuntimeError: failed to dlopen 'libamdhip64.so'"


def test_hiprtc_compile_and_launch_sequence(fake):
    hip, rtc = fake()
    fn = driver.function("src", "gfx942", "k", "hash")
    assert fn == "fn" and hip.code == b"\x7fELF" and hip.fn_name == b"k"
    assert rtc.opts[0] == b"--offload-arch=gfx942" and b"-std=c++17" in rtc.opts and b"-ffp-contract=off" in rtc.opts
    assert driver.function("src", "gfx942", "k", "hash") == "fn"           # loaded once
    assert hip.calls.count("hipModuleLoadData") == 1
    args = driver.device_struct([], [])
    driver.launch(fn, (3, 2, 1), 256, args, stream=1234)
    assert hip.launch[:5] == ("fn", (3, 2, 1), (256, 1, 1), 0, 1234) and hip.launch[6] == (args,)


def test_hiprtc_failure_carries_the_log(fake):
    fake(hiprtc=FakeHiprtc(ok=False))
    with pytest.raises(driver.HipError, match="error: oops"):
        driver.function("src", "gfx950", "k", "hash2")


def test_launch_failure_names_the_call(fake):
    hip, _ = fake(FakeHip(fail={"hipModuleLaunchKernel": 98}))
    with pytest.raises(BackendError, match="hipModuleLaunchKernel failed: hipError98 \\(fake error\\)"):
        driver.launch("fn", (1, 1, 1), 64, driver.device_struct([], []), stream=0)
