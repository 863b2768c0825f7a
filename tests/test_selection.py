"""Selection by device claims (Backend.claims_device) and the one spelling of a backend with a target,
"name[:arch[:emulated]]", as a call's argument, in hk.use_backend and in HK_BACKEND (the CLI: test_cli)."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, ArgumentError, BackendError
from hk_portable.runtime import registry, selection

from hk_test_plugins import RECORDING_BACKEND

# backends that claim devices, and one with a compile-only and an emulated target of one arch
CLAIMING_BACKENDS = RECORDING_BACKEND + '''

CLAIMS_ASKED = []


class ClaimsMeta(Recording):
    name = "claims_meta"

    def claims_device(self, device):
        CLAIMS_ASKED.append((self.name, device.type))
        return device.type == "meta"

    def accepts_device(self, device):
        return device.type == "meta"

    def launch(self, artifact, args, grid, stream=None):
        RUNS.append(self.name)             # meta tensors have no data: recording is all there is


class AlsoClaimsMeta(ClaimsMeta):
    name = "also_claims_meta"


class ClaimsMetaButUnusable(ClaimsMeta):
    name = "claims_meta_unusable"

    def status(self):
        return BackendStatus(False, "no meta device today")


class Twin(Recording):
    """One arch, 'x1', compile-only here and emulated; its launches record the target spec."""
    name = "twin"

    def targets(self):
        return [Target(backend="twin", arch="x1", compile_only=True),
                Target(backend="twin", arch="x1", emulated=True, capabilities=("run",)),
                Target(backend="twin", arch="x2", emulated=True, capabilities=("run",))]

    def status(self):
        return BackendStatus(False, "no twin device")

    def compile(self, program, target, options=None):
        return Artifact(self.name, target.spec, program.name, program.hash, payload=program)

    def launch(self, artifact, args, grid, stream=None):
        RUNS.append(artifact.target)
        ref = hk_portable.get_backend("reference")
        ref.launch(ref.compile(artifact.payload, ref.default_target()), args, grid, stream)
'''


@hk.kernel
def copy_kernel(x: GL[2], y: GL[2]):
    hk.store(y, hk.load(RT[x.dtype, 16, 16], x, (0, 0)), (0, 0))


def _copy(device="cpu", **kw):
    x = torch.arange(16 * 16, dtype=torch.float32, device=device).view(16, 16) + 1
    y = torch.zeros_like(x)
    copy_kernel(x, y, grid=(1,), **kw)
    if device != "meta":
        assert torch.equal(x, y)


@pytest.fixture
def install(fake_plugins):
    """install(name, ...): those backends of CLAIMING_BACKENDS as entry points; returns their module."""
    fake_plugins.module("hk_fake_claims", CLAIMING_BACKENDS)
    classes = {"claims_meta": "ClaimsMeta", "also_claims_meta": "AlsoClaimsMeta",
               "claims_meta_unusable": "ClaimsMetaButUnusable", "twin": "Twin", "alpha": "Alpha"}

    def install(*names, broken=False):
        eps = {n: f"hk_fake_claims:{classes[n]}" for n in names}
        if broken:
            eps["broken"] = "hk_fake_no_such_module:Backend"
        fake_plugins.distribution("hk-fake-claims", eps)
        import hk_fake_claims
        hk_fake_claims.RUNS.clear()
        hk_fake_claims.CLAIMS_ASKED.clear()
        return hk_fake_claims
    return install


# -------------------------------------------------------------------------------------- device claims
def test_the_backend_that_claims_the_device_runs_the_kernel(install):
    fake = install("claims_meta", "alpha")
    _copy("meta")
    _copy("cpu")                   # the reference claims the CPU; alpha claims nothing
    assert fake.RUNS == ["claims_meta"]


def test_claims_are_asked_once_per_device_type(install):
    fake = install("claims_meta")
    for _ in range(3):
        assert selection.select(None, [torch.empty(1, device="meta")]).backend.name == "claims_meta"
    selection.select(None, [torch.empty(1)])
    assert fake.CLAIMS_ASKED == [("claims_meta", "meta"), ("claims_meta", "cpu")]


def test_a_backend_that_fails_to_load_is_skipped_for_claims_and_reported(install):
    install("claims_meta", broken=True)
    assert selection.select(None, [torch.empty(1, device="meta")]).backend.name == "claims_meta"
    broken = {i.name: i for i in registry.report()}["broken"]
    assert not broken.loaded and "ModuleNotFoundError" in broken.reason


def test_a_registry_reset_makes_kernels_choose_again(install):
    install("claims_meta")
    _copy("meta")
    assert copy_kernel._launches and copy_kernel._artifacts
    registry.reset()               # plugins installed or removed: no kernel reuses its old choice
    assert not copy_kernel._launches and not copy_kernel._artifacts


def test_a_device_that_no_backend_claims_is_a_clear_error(install):
    install("alpha")
    with pytest.raises(BackendError, match=r"no installed backend claims tensors on 'meta' \(installed: .*alpha.*"
                                           r"reference.*\); name one with backend=\.\.\., hk.use_backend"):
        _copy("meta")


def test_a_device_claimed_twice_is_a_clear_error(install):
    install("claims_meta", "also_claims_meta")
    with pytest.raises(BackendError, match=r"tensors on 'meta' are claimed by several backends "
                                           r"\(also_claims_meta, claims_meta\)"):
        _copy("meta")


def test_a_claimant_that_cannot_run_here_says_why(install):
    install("claims_meta_unusable")
    with pytest.raises(BackendError, match="'claims_meta_unusable' cannot run kernels here: no meta device today"):
        _copy("meta")


def test_no_tensors_and_cpu_tensors_go_to_the_reference(monkeypatch):
    monkeypatch.delenv(selection.ENV, raising=False)
    assert selection.select(None, []).backend.name == "reference"
    assert selection.select(None, [torch.zeros(1)]).backend.name == "reference"


@pytest.mark.parametrize("rocm, claimant", [(None, "cuda"), ("6.2", "hip")])
def test_gpu_tensors_are_claimed_by_cuda_or_hip_by_the_torch_build(monkeypatch, rocm, claimant):
    """No GPU needed: a claim looks at the device type and torch's build, not at a device."""
    monkeypatch.setattr(torch.version, "hip", rocm)
    installed = [n for n in ("reference", "cuda", "hip") if n in registry.names()]
    claims = [n for n in installed if registry.load(n).claims_device(torch.device("cuda"))]
    assert claims == ([claimant] if claimant in installed else [])
    assert [n for n in installed if registry.load(n).claims_device(torch.device("cpu"))] == ["reference"]


# ------------------------------------------------------------------------------- the spec spelling
@pytest.mark.parametrize("spec", ["twin:x1:emulated", "twin:x2:emulated"])
def test_a_spec_names_the_target_as_an_argument(install, spec):
    fake = install("twin")
    _copy(backend=spec)
    assert fake.RUNS == [spec]


def test_a_spec_names_the_target_in_use_backend_and_hk_backend(install, monkeypatch):
    fake = install("twin")
    with hk.use_backend("twin:x2:emulated"):
        _copy()
    monkeypatch.setenv("HK_BACKEND", "twin:x1:emulated")
    _copy()
    monkeypatch.setenv("HK_BACKEND", "claims_meta_missing:x1, twin:x2:emulated")
    with pytest.raises(BackendError, match="no backend named 'claims_meta_missing'"):
        _copy()
    assert fake.RUNS == ["twin:x2:emulated", "twin:x1:emulated"]


def test_the_reference_takes_its_own_spec():
    _copy(backend="reference:cpu")
    with hk.use_backend("reference:cpu"):
        _copy()


MALFORMED = ["twin:", "twin:x1:emulatd", ":x1", "twin:x1:emulated:more", "twin::emulated"]


@pytest.mark.parametrize("spec", MALFORMED)
def test_a_malformed_spec_is_a_clear_error_in_every_place(install, monkeypatch, spec):
    install("twin")
    expected = r"backend spec .*: expected NAME, NAME:ARCH or NAME:ARCH:emulated"
    with pytest.raises(BackendError, match=expected):
        _copy(backend=spec)
    with pytest.raises(BackendError, match=expected):
        with hk.use_backend(spec):
            pass
    monkeypatch.setenv("HK_BACKEND", spec)
    with pytest.raises(BackendError, match=f"HK_BACKEND='{spec}': " + expected):
        _copy()


def test_an_unknown_arch_is_a_clear_error_in_every_place(install, monkeypatch):
    install("twin")
    expected = r"backend spec 'twin:x9': backend 'twin' has no target 'x9'; its targets are \['x1', 'x1:emulated'"
    with pytest.raises(BackendError, match=expected):
        _copy(backend="twin:x9")
    with pytest.raises(BackendError, match=expected):
        with hk.use_backend("twin:x9"):
            pass
    monkeypatch.setenv("HK_BACKEND", "twin:x9")
    with pytest.raises(BackendError, match="HK_BACKEND='twin:x9': " + expected):
        _copy()
    with pytest.raises(BackendError, match=r"backend 'twin' has no emulated target 'x9'"):
        _copy(backend="twin:x9:emulated")


def test_a_compile_only_target_cannot_run_and_the_error_names_the_emulated_ones(install):
    install("twin")
    with pytest.raises(BackendError, match=r"target 'twin:x1' is compile-only on this machine: kernels cannot run "
                                           r"on it \(its emulated targets run here: name one as 'twin:x1:emulated', "
                                           r"'twin:x2:emulated'\)"):
        _copy(backend="twin:x1")
    with pytest.raises(BackendError, match=r"'twin' cannot run kernels here: no twin device \(its emulated targets"):
        _copy(backend="twin")


def test_the_target_argument_must_agree_with_the_spec(install):
    fake = install("twin")
    _copy(backend="twin:x2:emulated", target="x2")
    with pytest.raises(ArgumentError, match=r"the backend spec names target 'twin:x2:emulated' but target='x1'"):
        _copy(backend="twin:x2:emulated", target="x1")
    with hk.use_backend("twin:x2:emulated"):
        with pytest.raises(ArgumentError, match="names target 'twin:x2:emulated' but target='x1'"):
            _copy(target="x1")
    assert fake.RUNS == ["twin:x2:emulated"]


def test_a_backend_object_still_takes_a_target_argument(install):
    fake = install("twin")
    twin = registry.load("twin")
    _copy(backend=twin, target=twin.target("x2", emulated=True))
    assert fake.RUNS == ["twin:x2:emulated"]


# ------------------------------------------------------------------------- the hip emulator, for real
@hk.kernel
def scale_rows(x: GL[2], y: GL[2], s: float):
    m = hk.block_idx(0)
    hk.store(y, hk.load(RT[x.dtype, 16, 16], x, (m, 0)) * s, (m, 0))


def test_use_backend_runs_a_kernel_on_cpu_tensors_on_the_emulated_hip_target(hip_emulator, monkeypatch):
    monkeypatch.delenv("HK_BACKEND", raising=False)
    x = torch.randn(32, 16)
    y = torch.zeros_like(x)
    with hk.use_backend("hip:gfx942:emulated"):
        scale_rows(x, y, 2.0, grid=(2,))
    torch.testing.assert_close(y, x * 2, rtol=0, atol=0)
    assert {key[:2] for key in scale_rows._artifacts} == {("hip", "hip:gfx942:emulated")}
    z = torch.zeros_like(x)
    monkeypatch.setenv("HK_BACKEND", "hip:gfx942:emulated")    # the same compiled kernel, through the environment
    scale_rows(x, z, 2.0, grid=(2,))
    torch.testing.assert_close(z, x * 2, rtol=0, atol=0)
    assert len(scale_rows._artifacts) == 1


def test_hip_names_its_emulated_targets_when_it_cannot_run(hip_emulator, monkeypatch):
    if registry.load("hip").status().available:
        pytest.skip("a ROCm device is present")
    with pytest.raises(BackendError, match=r"'hip' cannot run kernels here: .*name one as 'hip:gfx942:emulated'"):
        scale_rows(torch.zeros(16, 16), torch.zeros(16, 16), 1.0, grid=(1,), backend="hip")
    with pytest.raises(BackendError, match=r"backend spec 'hip:gfx90a:emulated': backend 'hip' has no emulated "
                                           r"target 'gfx90a'"):
        scale_rows(torch.zeros(16, 16), torch.zeros(16, 16), 1.0, grid=(1,), backend="hip:gfx90a:emulated")
