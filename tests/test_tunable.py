"""Tunable consts (issue 42): a kernel declares which consts a backend may choose and their legal values
(`hk.kernel(tunable=...)`, interface/tunables.py); each backend proposes per-target tile shapes from its arch table
(`Backend.propose`); the configuration is chosen by the autotuner where a device runs, else by the backend, and kept
per shape bucket. The library's gemm goes through the same path. The README's tutorial kernel (examples/gelu_linear.py)
runs on the reference and both emulated AMD targets against float64 torch."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, ST, ArgumentError, f32
from hk_portable.kernels import KERNELS
from hk_portable.kernels import gemm as gemm_mod
from hk_portable.runtime import tuning

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gelu_linear.py"


def _example():
    spec = importlib.util.spec_from_file_location("gelu_linear_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ex = _example()


@pytest.fixture
def tuning_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(tuning.ENV, raising=False)
    tuning.forget()
    yield tmp_path
    tuning.forget()


def _small_gemm(tunable=None, **kw):
    """A kernel of this test's own: c = a @ b over shared tiles, tunable as given."""
    @hk.kernel(tunable=tunable, **kw)
    def small_gemm(a: GL[2], b: GL[2], c: GL[2], *, BM: hk.const = 32, BN: hk.const = 32, BK: hk.const = 32):
        m, n = hk.block_idx(0), hk.block_idx(1)
        a_s = hk.shared(ST[a.dtype, BM, BK], stages=2)
        b_s = hk.shared(ST[b.dtype, BK, BN], stages=2)

        def load(k, s):
            hk.load(a_s[s], a, (m, k))
            hk.load(b_s[s], b, (k, n))

        def compute(k, s, acc):
            return hk.mma(a_s[s], b_s[s], acc)

        acc = hk.pipeline(hk.cdiv(a.shape[1], BK), load, compute, carry=hk.zeros(RT[f32, BM, BN]), stages=2)
        hk.store(c, acc.to(c.dtype), (m, n))
    return small_gemm


TILES = dict(BM=hk.tunable(16, 32, 64, role="m"), BN=hk.tunable(range(16, 65, 16), role="n"),
             BK=hk.tunable(16, 32, role="k"))


def _operands(M=70, N=50, K=40):
    g = torch.Generator().manual_seed(M * N + K)
    return torch.randn(M, K, generator=g).bfloat16(), torch.randn(K, N, generator=g).bfloat16()


# ------------------------------------------------------------------------------------------ the declaration
def test_an_illegal_value_names_the_const_and_its_legal_values():
    a, b = _operands()
    c = torch.empty(70, 50)
    with pytest.raises(ArgumentError, match=r"gemm_kernel: tunable const 'BM' must be one of its legal values "
                                            r"range\(16, 513, 16\): 16\.\.512 step 16, got 24"):
        gemm_mod.gemm_kernel.trace(a, b, c, BM=24)
    with pytest.raises(ArgumentError, match=r"'num_warps' must be one of its legal values \{1, 2, 4, 8, 16\}, got 3"):
        gemm_mod.gemm(a, b, backend="reference", num_warps=3)
    k = _small_gemm(TILES)
    with pytest.raises(ArgumentError, match=r"'BM' must be one of its legal values \{16, 32, 64\}, got 32\.0"):
        k(a, b, c, grid=(3, 2), backend="reference", BM=32.0)     # 32.0 == 32, but not a tile size


@pytest.mark.parametrize("decl, message", [
    (dict(BX=hk.tunable(16)), "tunable 'BX' is not one of its consts with a default"),
    (dict(BM=hk.tunable(64, 128)), "the default of tunable 'BM', 32, is not one of its legal values"),
    (dict(BM=hk.tunable(32, role="m"), BN=hk.tunable(32, role="m")), "both have role 'm'"),
    (dict(BM=(32, 64)), "must be hk.tunable"),
])
def test_a_bad_declaration_fails_at_decoration(decl, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        _small_gemm(decl)


def test_tunable_checks_its_arguments():
    with pytest.raises(TypeError, match="role must be one of"):
        hk.tunable(16, role="tile")
    with pytest.raises(TypeError, match="at least one legal value"):
        hk.tunable()


def test_a_kernel_without_a_declaration_keeps_its_consts():
    a, b = _operands()
    k = _small_gemm()
    c = torch.empty(70, 50)
    assert k.tunables is None
    assert k.configure(a, b, c, backend="cuda:sm_90a") == {}                      # nothing chosen for it
    assert k.configure(a, b, c, backend="hip:gfx950", BM=16) == {"BM": 16}
    assert k.choose_config([{}], a, b, c, backend="cuda:sm_90a") == {}             # no proposal joins its list


# ----------------------------------------------------------------------------------- proposals and choice
def test_proposals_are_mapped_by_role_and_illegal_ones_dropped():
    """cuda on sm_90a proposes 128x256x64/8 warps, 128x128x64/8 and 64x64x64/4: this kernel allows BM up to 64,
    BK 16 or 32 and declares no stages or warps, so every proposal holds an illegal value and is dropped; a proposal
    cut to its roles where it declares only BM and BN is kept where legal."""
    be = hk.get_backend("cuda")
    tgt = be.target("sm_90a")
    base = {"BM": 32, "BN": 32, "BK": 32}
    assert _small_gemm(TILES)._with_proposals((base,), be, tgt) == (base,)
    mn = _small_gemm(dict(BM=hk.tunable(16, 32, 64, role="m"), BN=hk.tunable(range(16, 65, 16), role="n")))
    assert mn._with_proposals((base,), be, tgt) == ({"BM": 64, "BN": 64, "BK": 32}, base)
    assert mn._with_proposals((base,), be, tgt, fixed={"BN"}) == ({"BM": 64, "BN": 32, "BK": 32}, base)


def test_a_kernel_candidate_outside_the_declaration_is_an_error():
    a, b = _operands()
    with pytest.raises(ArgumentError, match="'BK' must be one of its legal values"):
        _small_gemm(TILES).choose_config([{"BK": 48}, {}], a, b, torch.empty(70, 50), backend="reference")


def test_gemm_joins_the_backends_proposals_and_keeps_its_choice():
    """One mechanism: gemm's own candidates, then each backend's proposals (new ones only), its baseline last; what
    each target runs is unchanged (hk compile's generated source too, hashed before and after)."""
    meta = [torch.empty(256, 256, dtype=d, device="meta") for d in (torch.bfloat16, torch.bfloat16, torch.float32)]
    cands = tuple(gemm_mod.candidates({}, meta))
    for spec, arch in (("cuda", "sm_90a"), ("cuda", "sm_80"), ("hip", "gfx942"), ("hip", "gfx950")):
        be = hk.get_backend(spec)
        joined = gemm_mod.gemm_kernel._with_proposals(cands, be, be.target(arch))
        assert joined[:len(cands) - 1] == cands[:-1] and joined[-1] == cands[-1], spec
        full = [tuple(sorted({**gemm_mod.gemm_kernel.defaults(), **c}.items())) for c in joined]
        assert len(set(full)) == len(full), f"{spec}:{arch}: a proposal repeats a candidate"
    chosen = {arch: gemm_mod.gemm_kernel.choose_config(cands, *meta, backend=f"{be}:{arch}")
              for be, arch in (("cuda", "sm_90a"), ("hip", "gfx950"), ("hip", "gfx942"))}
    assert chosen["sm_90a"] == {**gemm_mod.DEFAULT_CONFIG, **gemm_mod.CONFIGS[0]}
    assert chosen["gfx950"] == {**gemm_mod.DEFAULT_CONFIG, **gemm_mod.CONFIGS[3]}          # the hip table's deep K
    assert chosen["gfx942"] == {**gemm_mod.DEFAULT_CONFIG, **gemm_mod.CONFIGS[1]}


def test_a_callable_grid_gets_the_chosen_config_and_a_fixed_grid_the_defaults(tuning_dir, monkeypatch):
    """The reference proposes nothing; given proposals (a stand-in arch table), the autotuner times them with the
    kernel's defaults on the CPU, stores the winner per shape bucket, and the call runs it with the grid it implies.
    A fixed grid pins the declared defaults (it was computed from them)."""
    be = hk.get_backend("reference")
    monkeypatch.setattr(type(be), "propose", lambda self, roles, tgt: [dict(m=64, n=64, k=16), dict(m=128, n=16)])
    k = _small_gemm(TILES)
    a, b = _operands()
    want = a.double() @ b.double()
    seen = []

    def grid(cfg):
        seen.append(dict(cfg))
        return hk.cdiv(70, cfg["BM"]), hk.cdiv(50, cfg["BN"])

    c = torch.full((70, 50), float("nan"))
    k(a, b, c, grid=(3, 2), backend="reference")                        # defaults: 32x32 tiles
    torch.testing.assert_close(c.double(), want, rtol=1e-5, atol=1e-4)
    assert seen == []
    assert k.configure(a, b, c, backend="reference") == {"BM": 32, "BN": 32, "BK": 32}     # the backend's: baseline
    monkeypatch.setenv(tuning.ENV, "1")
    k._configs.clear()                      # a process decides once (as the library's wrappers): start it again
    c.fill_(float("nan"))
    k(a, b, c, grid=grid, backend="reference")
    torch.testing.assert_close(c.double(), want, rtol=1e-5, atol=1e-4)
    timed = {tuple(sorted(s.items())) for s in seen[:-1]}
    assert len(timed) == 2, f"the baseline and the one legal proposal (128 is not a legal BM): {seen}"
    data = (tuning_dir / tuning.FILE).read_text()
    assert "small_gemm" in data and str(list(tuning.bucket(70, 40, 40, 50, 70, 50))) in data.replace("\n", "")


# ------------------------------------------------------------------------------ the README's tutorial kernel
BACKENDS = ["reference", "hip:gfx942:emulated", "hip:gfx950:emulated"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("M, N, K, out_dtype", [(100, 90, 70, torch.bfloat16), (64, 64, 64, torch.float32),
                                                (1, 17, 33, torch.float32)])
def test_the_tutorial_kernel_matches_float64_torch(backend, M, N, K, out_dtype):
    g = torch.Generator().manual_seed(M + N + K)
    x = torch.randn(M, K, generator=g).bfloat16()
    w = torch.randn(N, K, generator=g).bfloat16()
    bias = torch.randn(N, generator=g).bfloat16()
    y = torch.full((M, N), float("nan"), dtype=out_dtype)
    ex.linear_gelu(x, w, bias, out=y, backend=backend)
    want = ex.reference(x, w, bias)
    # f32 accumulation of K products (exact) relative to sum |x||w|, tanh-GELU's slope <= 1.13 carrying it, the
    # device tanh (a few f32 ulps) and one rounding to the output dtype
    scale = x.double().abs() @ w.double().abs().t() + bias.double().abs()
    out_ulp = 2.0 ** -8 if out_dtype == torch.bfloat16 else 2.0 ** -22
    bound = 1.2 * K * 2.0 ** -23 * scale + 2.0 ** -20 * (1 + want.abs()) + out_ulp * want.abs()
    err = (y.double() - want).abs()
    assert not y.isnan().any()
    assert (err <= bound).all(), f"max error {float((err - bound).max())} over the bound"


def test_the_readme_tutorial_is_the_example_file():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Tunable kernels", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    code = EXAMPLE.read_text()
    kernel = code.split("# --- README: tunable kernel ---\n", 1)[1].split("# --- end ---", 1)[0]
    assert block.strip() == kernel.strip(), "README.md's tunable kernel and examples/gelu_linear.py differ"


# (a config per target: what a call and `hk compile` choose today; a change here is a change of what runs)
# hip's wave-grid accumulators take the bias's broadcast (codegen/layouts.GRID_VECTOR_OPS) and the GELU epilogue is
# computed inside the store, element by element (hip patterns.fused_epilogues), so the table's 256x256 block on 8
# waves runs without spilling, at 1.0 of the matrix peak in the analyser's model (was the 64x64 baseline at 0.57,
# LDS-bound; with the epilogue as whole tiles the 256x256 block spilled 11 VGPRs on gfx942, 55 on gfx950)
CHOSEN = {"gfx942": dict(BM=256, BN=256, BK=16, STAGES=3, num_warps=8),
          "gfx950": dict(BM=256, BN=256, BK=32, STAGES=3, num_warps=8)}


@pytest.mark.parametrize("arch", sorted(CHOSEN))
def test_the_tutorial_compiles_offline_without_spills(arch, capsys):
    from hk_portable.backends.hip import compiler
    ok, why = compiler.available()
    if not ok:
        pytest.skip(why)
    args, consts = ex.example_args(device="meta", M=4096, N=4096, K=4096)
    cfg = ex.gelu_linear.configure(*args, backend=f"hip:{arch}", **consts)
    res = ex.gelu_linear.compile(*args, backend=f"hip:{arch}", **cfg).resources
    with capsys.disabled():
        print(f"\ngelu_linear on hip:{arch}: {cfg}, {res['vgpr']} VGPRs, {res['agpr']} AGPRs, {res['lds_bytes']} B LDS")
    assert {**ex.gelu_linear.defaults(), **cfg} == CHOSEN[arch]
    assert res["vgpr_spill"] == res["sgpr_spill"] == res["scratch_bytes"] == 0, res
    assert not [n for k, n in ex.gelu_linear.config_notes.items() if k[0] == f"hip:{arch}"]   # nothing passed over
    art = ex.gelu_linear.compile(*args, backend=f"hip:{arch}", **cfg)
    assert any(f["opcode"] == "store epilogue" for f in art.launch["plan"]["fused"])
    (loop,) = hk.get_backend("hip").analyze(art)["loops"]
    assert loop["one_trip"]["clocks"]["bound_vs_peak"] >= 0.9, loop["one_trip"]["clocks"]     # issue 42's floor


@pytest.mark.parametrize("arch", sorted(CHOSEN))
@pytest.mark.parametrize("M, N, ydtype", [(200, 136, torch.float32), (512, 256, torch.bfloat16)])
def test_the_offline_choice_runs_on_the_emulator(arch, M, N, ydtype):
    """The configuration a gfx942/gfx950 call runs (a 2x4 wave grid whose bias is a grid column vector, the GELU
    computed as the store writes) against float64 on the wave64 emulator: ragged in M and N (the epilogue's
    predicated path), and whole 256x256 tiles into bf16 (its unpredicated path and the conversion)."""
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(M, 96, generator=g).bfloat16(), torch.randn(N, 96, generator=g).bfloat16()
    bias = torch.randn(N, generator=g).bfloat16()
    y = torch.full((M, N), float("nan"), dtype=ydtype)
    cfg = CHOSEN[arch]
    ex.gelu_linear(x, w, bias, y, backend=f"hip:{arch}:emulated", grid=(hk.cdiv(M, cfg["BM"]), hk.cdiv(N, cfg["BN"])),
                   **cfg)
    ref = ex.reference(x, w, bias)
    err = (y.double() - ref).abs().max().item()
    assert err < (2e-4 if ydtype == torch.float32 else 2 ** -8 * ref.abs().max().item()), err


@pytest.mark.parametrize("backend, target", [("cuda", "sm_90a"), ("hip", "gfx950"), ("reference", None)])
def test_hk_compile_of_a_tunable_user_kernel_compiles_the_targets_choice(capsys, backend, target):
    """What `hk compile` builds is what a call on that target runs (configure's choice; on sm_90a a TMA + wgmma tile
    from cuda's table unless the NVRTC at hand spills it, on hip CHOSEN above, on the reference the defaults)."""
    from hk_portable.cli import main
    args, consts = ex.example_args(device="meta")
    cfg = {**ex.gelu_linear.defaults(), **ex.gelu_linear.configure(*args, backend=backend, target=target, **consts)}
    rc = main(["compile", f"{EXAMPLE}:gelu_linear", "--backend", backend, *(["--target", target] if target else []),
               "--emit", "ir"])
    head = capsys.readouterr().out.splitlines()[0]
    warps = cfg.pop("num_warps")
    want = "consts{" + ", ".join(f"{k}={v}" for k, v in sorted(cfg.items())) + f"}} warps={warps} {{"
    assert rc == 0 and head.endswith(want), (head, want)
    if backend == "hip":
        assert {**cfg, "num_warps": warps} == CHOSEN[target]


def test_the_library_kernels_that_declare_tunables():
    """gemm and gemm_fp8 declare their tiles with roles (backends propose for them); attention_fwd its legal values
    only (no roles: no proposals join its candidates)."""
    from hk_portable.kernels import attention, gemm_fp8
    assert gemm_mod.gemm_kernel.tunables.roles() == ("m", "n", "k", "stages", "warps")
    assert gemm_fp8.gemm_fp8_kernel.tunables.roles() == ("m", "n", "k", "stages", "warps")
    assert not gemm_fp8.gemm_fp8_kernel.tunables.specs["BK"].allows(16)        # fp8 K steps are whole 32-deep blocks
    assert attention.attention_fwd_kernel.tunables.roles() == ()
    be = hk.get_backend("cuda")
    base = {"BM": 64, "BN": 64}
    assert attention.attention_fwd_kernel._with_proposals((base,), be, be.target("sm_90a")) == (base,)


def _configs_of(name: str):
    """(kernel, configurations) of a KERNELS entry: its example's and its module's candidates() for it, and the
    other configurations its module offers that kernel (fallbacks, per-shape configs) over shapes it takes."""
    from hk_portable import kernels
    from hk_portable.kernels import attention_bwd, attention_kvcache, layernorm, layernorm_bwd, rotary
    module, kern, _, configs = kernels.offered_configs(name)
    if module is attention_bwd:
        for d in (64, 128, 256):
            for atomic in (True, False):
                configs += attention_bwd.candidates(dict(D=d, MASKED=True, ATOMIC_DQ=atomic))
            configs += [attention_bwd.config_for(d), *attention_bwd.fallbacks_for(d)]
    elif module is attention_kvcache:
        configs += [attention_kvcache.kvcache_config(d, r, page, paged) for d in (64, 128, 256) for r in (1, 16, 17, 256)
                    for page in (16, 32, 256) for paged in (True, False)]
    elif module in (layernorm, layernorm_bwd):
        configs += [{**module.DEFAULT_CONFIG, **c} for d in (1, 100, 1000, 4096, 8192, 16384, 70000)
                    for c in layernorm.one_pass_shapes(d, module.ONE_PASS_MAX_PER_LANE)]
    elif module is rotary:
        configs += [{**rotary.DEFAULT_CONFIG, **c} for h in (1, 3, 8, 16, 32, 64, 128) for half in (32, 64, 128)
                    for size in (2, 4) for c in rotary.heads_shapes(h, half, size)]
    return kern, configs


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_library_kernel_declares_its_tiles_and_offers_only_legal_configurations(name):
    """One mechanism (issue 42 item 2): every kernel of the library's registry declares its tile consts tunable, and
    every configuration its module offers (example, candidates(), fallbacks, per-shape configs) and its defaults
    are legal. Roles only where a backend's generic tile proposal fits (the GEMMs): the others get no proposal, so
    each target's choice among their candidates is what it was before they declared."""
    kern, configs = _configs_of(name)
    assert kern.tunables is not None, f"{name}: declares no tunable consts"
    kern.tunables.check(kern.defaults())
    for cfg in configs:
        kern.tunables.check(cfg)            # the ArgumentError naming the const where one is not legal
    if name in ("gemm", "gemm_fp8"):
        assert kern.tunables.roles() == ("m", "n", "k", "stages", "warps")
        return
    assert kern.tunables.roles() == ()
    cands = tuple(configs[1:]) or (configs[0],)
    for spec, arch in (("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx942"), ("hip", "gfx950")):
        be = hk.get_backend(spec)
        assert kern._with_proposals(cands, be, be.target(arch)) == cands


def test_the_other_tile_kernels_of_the_library_declare_too():
    """The kernels a library wrapper chooses tiles for beside the registry's: attention_bwd's deterministic dQ kernel
    (dq_candidates) and the varlen backward's two."""
    from hk_portable.kernels import attention_bwd as ab, attention_bwd_wide as w, attention_varlen as av
    for d in (64, 128, 256):
        for cfg in ab.dq_candidates(dict(D=d, MASKED=True)):
            ab.attention_bwd_dq_kernel.tunables.check(cfg)
    for cfg in w.candidates(dict(D=256, MASKED=True, ATOMIC_DQ=True, SOFTCAP=False)) + [w.varlen_config_for(256)]:
        w.attention_bwd_dkdv_wide_kernel.tunables.check(cfg)    # the head dims above 128 (issue 40)
    for kern in (ab.attention_bwd_dq_kernel, av.attention_varlen_bwd_dkdv_kernel, av.attention_varlen_bwd_dq_kernel,
                 w.attention_bwd_dkdv_wide_kernel, w.attention_varlen_bwd_dkdv_wide_kernel):
        assert kern.tunables is not None and kern.tunables.roles() == ()
        assert set(kern.tunables.names) == {"BM", "BN", "STAGES", "num_warps"}


def _bwd_inputs(N=32, D=64):
    g = torch.Generator().manual_seed(N + D)
    q, k, v, do = (torch.randn(1, 2, N, D, generator=g).bfloat16() for _ in range(4))
    o = torch.randn(1, 2, N, D, generator=g).bfloat16()
    lse = torch.randn(1, 2, N, generator=g)
    return q, k, v, o, lse, do


def test_an_illegal_tile_passed_to_a_library_kernel_names_the_const_and_its_legal_values():
    """attention_bwd's config= and dq_tiles=, and the other kernels' consts, outside their declared values: the
    ArgumentError names the kernel, the const and its legal set (before, the trace or a target's check met them)."""
    from hk_portable.kernels import attention_bwd as ab, attention_kvcache, layernorm, rotary
    from hk_portable.kernels.attention_bwd import attention_bwd
    q, k, v, o, lse, do = _bwd_inputs()
    legal16 = re.escape("range(16, 513, 16): 16..512 step 16")
    with pytest.raises(ArgumentError, match=rf"attention_bwd_dkdv_kernel: tunable const 'BM' must be one of its legal "
                                            rf"values {legal16}, got 40"):
        attention_bwd(q, k, v, o, lse, do, causal=True, backend="reference",
                      config=dict(ab.config_for(64), BM=40))
    with pytest.raises(ArgumentError, match=r"attention_bwd_dq_kernel: tunable const 'STAGES' must be one of its "
                                            r"legal values range\(1, 9\): 1..8, got 0"):
        attention_bwd(q, k, v, o, lse, do, causal=True, deterministic=True, backend="reference",
                      dq_tiles=dict(ab.dq_config_for(64), STAGES=0))
    with pytest.raises(ArgumentError, match=r"attention_bwd_dkdv_kernel: tunable const 'num_warps' must be one of its "
                                            r"legal values \{1, 2, 4, 8, 12, 16\}, got 3"):
        ab.attention_bwd_dkdv_kernel.trace(*ab.example_args(device="meta")[0], num_warps=3)
    args, consts = attention_kvcache.example_args()
    with pytest.raises(ArgumentError, match=rf"attention_kvcache_kernel: tunable const 'BN' must be one of its legal "
                                            rf"values {legal16}, got 24"):
        attention_kvcache.attention_kvcache_kernel.trace(*args, **{**consts, "BN": 24})
    args, consts = layernorm.example_args()
    with pytest.raises(ArgumentError, match=r"tunable const 'BC' must be one of its legal values "
                                            r"range\(8, 16385, 8\): 8..16384 step 8, got 100"):
        layernorm.dropout_residual_layernorm_kernel.trace(*args, **{**consts, "BC": 100})
    args, consts = rotary.example_args()
    with pytest.raises(ArgumentError, match=r"rotary_kernel: tunable const 'BH' must be one of its legal values "
                                            r"range\(1, 257\): 1..256, got 0"):
        rotary.rotary_kernel.trace(*args, **{**consts, "BH": 0})
