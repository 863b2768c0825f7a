"""The hk::gl argument ABI (codegen/abi.py) is one layout for every host: the cuda parameter buffer, the
hip argument segment (ctypes) and the emulators' packing all give the same bytes."""
from __future__ import annotations

import ctypes
import struct

import pytest
import torch

from hk_portable.backends.cuda import driver as cuda_driver
from hk_portable.backends.hip import driver as hip_driver
from hk_portable.codegen import abi
from hk_portable.interface.backend import Artifact
from hk_portable.interface.dtypes import bf16, f32, i32
from hk_portable.interface.ir import GlobalType, Param, ScalarType

PARAMS = [Param("n", ScalarType(i32)), Param("x", GlobalType(bf16, 2)), Param("y", GlobalType(f32, 3)),
          Param("s", ScalarType(f32)), Param("z", GlobalType(f32, 1))]


def _args():
    x = torch.zeros(7, 9, dtype=torch.bfloat16)[:, 1:]
    y = torch.zeros(2, 3, 4).transpose(0, 2)
    return [5, x, y, 2.5, torch.zeros(6)]


@pytest.mark.parametrize("rank,size", [(1, 24), (2, 32), (3, 48), (4, 56)])
def test_gl_format_matches_its_ctypes_mirror(rank, size):
    assert abi.gl_size(rank) == size == ctypes.sizeof(abi.gl_struct(rank))
    s = abi.gl_struct(rank)
    assert [s.ptr.offset, s.shape.offset, s.stride.offset] == [0, 8, 8 + 4 * rank + 4 * (rank % 2)]


def test_layout_offsets_are_c_alignment():
    _, size, desc = abi.param_layout(PARAMS)
    assert [(d["offset"], d["size"]) for d in desc] == [(0, 4), (8, 32), (40, 48), (88, 4), (96, 24)]
    assert size == 120
    mirror = abi.args_struct(abi.kinds(PARAMS))
    assert [getattr(mirror, f"a{i}").offset for i in range(len(PARAMS))] == [d["offset"] for d in desc]


def test_cuda_and_hip_pack_the_same_bytes():
    args = _args()
    fmt, size, desc = abi.param_layout(PARAMS)
    art = Artifact(backend="cuda", target="sm_80", kernel_name="k", program_hash="0", binary=b"",
                   launch={"params": desc, "param_format": fmt, "param_size": size})
    plan = cuda_driver._Packing()
    plan._init_packing(art.launch)
    buf = bytearray(size)
    plan._pack(args, buf, "k")                                  # the cuda (and cuda emulator) buffer
    hip = bytes(hip_driver.device_struct(PARAMS, args))[:size]   # the hip argument segment
    assert bytes(buf) == hip
    x, y = args[1], args[2]
    vals = struct.unpack(fmt, bytes(buf))
    assert vals == (5, x.data_ptr(), 7, 8, 9, 1, y.data_ptr(), 4, 3, 2, 1, 4, 12, 2.5, args[4].data_ptr(), 6, 1)


def test_hip_emulator_blobs_use_the_shared_gl_format():
    class FakeEmulator:
        @staticmethod
        def blob(fmt, tensor, *values):
            return ("blob", fmt, tensor.data_ptr(), values)

        @staticmethod
        def i32(v):
            return ("i32", v)

        @staticmethod
        def f32(v):
            return ("f32", v)

    args = _args()
    out = hip_driver.emulator_args(PARAMS, args, FakeEmulator)
    assert out[0] == ("i32", 5) and out[3] == ("f32", 2.5)
    assert out[1] == ("blob", abi.gl_format(2), args[1].data_ptr(), (7, 8, 9, 1))
    # the blob's bytes, with the tensor's pointer in place, are the buffer's bytes for that parameter
    packed = struct.pack(abi.gl_format(2), *abi.gl_values(args[1]))
    _, _, desc = abi.param_layout(PARAMS)
    assert len(packed) == desc[1]["size"]
