"""Every backend's compile options: a frozen, hashable, validated dataclass; unknown keys are refused by
name; compile() takes None, a dict or the dataclass and the Artifact records to_json()."""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

import hk_portable as hk
from hk_portable.backends.cuda import CudaBackend
from hk_portable.backends.cuda.options import CudaOptions
from hk_portable.backends.hip import HipBackend
from hk_portable.backends.hip.options import HipOptions
from hk_portable.backends.reference import ReferenceBackend
from hk_portable.backends.reference.options import ReferenceOptions
from hk_portable.codegen.options import OptionError
from hk_portable.interface import GL, RT, f32

OPTIONS = [(CudaOptions, {"ftz": True, "min_blocks": 2}), (HipOptions, {"waves": 8, "schedule": "pingpong"}),
           (ReferenceOptions, {})]


@pytest.mark.parametrize("cls,values", OPTIONS, ids=lambda x: getattr(x, "__name__", ""))
def test_frozen_hashable_and_round_trips(cls, values):
    opts = cls.from_dict(values)
    assert hash(opts) == hash(cls(**values)) and opts == cls.coerce(values) == cls.coerce(opts)
    assert cls.from_dict(opts.to_json()) == opts
    assert cls.coerce(None) == cls()
    for name in cls.names():
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(opts, name, None)


@pytest.mark.parametrize("cls", [CudaOptions, HipOptions, ReferenceOptions])
def test_unknown_key_is_refused_by_name(cls):
    with pytest.raises(OptionError, match=r"unknown compile option 'fast_math'.*its options are"):
        cls.from_dict({"fast_math": True})
    with pytest.raises(OptionError, match="must be None, a dict"):
        cls.coerce(["ftz"])


@pytest.mark.parametrize("cls,values,match", [
    (CudaOptions, {"ftz": 1}, "ftz=1: expected True or False"),
    (CudaOptions, {"min_blocks": 0}, "min_blocks=0"),
    (HipOptions, {"waves": 17}, "17 waves per block"),
    (HipOptions, {"schedule": "fastest"}, "unknown pipeline schedule"),
    (HipOptions, {"fp_contract": "maybe"}, "fp_contract='maybe'"),
    (HipOptions, {"prefetch": "sometimes"}, "prefetch='sometimes'"),
])
def test_bad_values_are_refused(cls, values, match):
    with pytest.raises(OptionError, match=match):
        cls.from_dict(values)


def test_cuda_flags_follow_the_options():
    assert CudaOptions().nvrtc_flags()[:5] == ("-std=c++17", "-ftz=false", "-fmad=false", "-prec-div=true",
                                               "-prec-sqrt=true")
    assert "-ftz=true" in CudaOptions(ftz=True).nvrtc_flags()
    assert HipOptions().device_flags() == ("-O3", "-std=c++17", "-ffp-contract=off")


@hk.kernel
def add_one(x: GL[2], y: GL[2]):
    hk.store(y, hk.load(RT[f32, 16, 16], x, (0, 0)) + 1.0, (0, 0))


def _program():
    x = torch.zeros(16, 16)
    return add_one.trace(x, x.clone())


def test_reference_records_its_options():
    be = ReferenceBackend()
    art = be.compile(_program(), be.default_target(), {})
    assert art.options["interpreter"] == "torch"
    with pytest.raises(OptionError, match="'ftz'"):
        be.compile(_program(), be.default_target(), {"ftz": False})


def test_hip_records_its_options():
    be = HipBackend()
    art = be.compile(_program(), be.target("gfx942", emulated=False), HipOptions(waves=2))
    assert {k: art.options[k] for k in HipOptions.names()} == HipOptions(waves=2).to_json()
    assert art.launch["plan"]["waves"] == 2
    with pytest.raises(OptionError, match="'wave'"):
        be.compile(_program(), be.target("gfx942", emulated=False), {"wave": 2})


@pytest.mark.skipif(importlib.util.find_spec("cupy_backends") is None, reason="NVRTC (cupy) is not installed")
def test_cuda_records_its_options():
    be = CudaBackend()
    art = be.compile(_program(), be.target("sm_80", emulated=False), {"min_blocks": 1})
    assert {k: art.options[k] for k in CudaOptions.names()} == CudaOptions(min_blocks=1).to_json()
    assert art.options["launch_bounds_min_blocks"] == 1 and "__launch_bounds__(128, 1)" in art.source


def test_cuda_emulated_target_takes_only_the_numerics_policy():
    be = CudaBackend()
    if not any(t.emulated for t in be.targets()):
        pytest.skip("no host C++ compiler for the cuda emulation")
    with pytest.raises(OptionError, match="numerics policy"):
        be.check(_program(), be.target("sm_80", emulated=True), {"ftz": True})
