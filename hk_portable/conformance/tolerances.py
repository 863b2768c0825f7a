"""The one tolerance table of the conformance suite (DESIGN section 4).

Every op and kernel output the suite checks has an entry per dtype: the tier and, for the bounded
tier, the error bound with the reason it is what it is. Backends are held to these numbers; change a
bound here, with its reason, never in a case.

Exact tier: the output equals the float64 math rounded once to the output dtype, bit for bit (and
equals the reference backend bit for bit).

Bounded tier: element i passes when |out_i - ref_i| <= abs + (rel + per_term * k) * scale_i, where
ref_i is the float64 result, k the number of terms an element sums (reduction length, mma K; 0 for
elementwise ops) and scale_i the magnitude the error is relative to: |ref_i| for elementwise ops,
sum |x| for sums, |acc| + sum |a||b| for mma, and a kernel-specific magnitude for kernels (see the
kernel cases). The reported error is |out_i - ref_i| / (scale_i + abs / rel_total), in the units of the
reported bound rel_total = rel + per_term * k.
"""
from __future__ import annotations

from dataclasses import dataclass

EXACT = "exact"
BOUNDED = "bounded"

U32 = 2.0 ** -24                 # unit roundoff of f32 (half an ulp at 1.0)
# fp8 mma sums: sm_90a's fp8 wgmma keeps about 14 bits while it accumulates (DeepSeek-V3's report; an H200
# run on 2026-12-02 exceeded f32's 2u per term at K=1056), so the per-term bound is 2^-18 (2^5 times f32's)
FP8_SUM = 2.0 ** -18
EPS = {"bf16": 2.0 ** -7, "f16": 2.0 ** -10, "f32": 2.0 ** -23}   # one ulp at 1.0 (torch.finfo().eps)
TINY = {"bf16": 2.0 ** -126, "f16": 2.0 ** -14, "f32": 2.0 ** -126}  # smallest normal


@dataclass(frozen=True)
class Bound:
    tier: str                    # EXACT | BOUNDED
    reason: str
    rel: float = 0.0
    abs: float = 0.0
    per_term: float = 0.0

    @property
    def exact(self) -> bool:
        return self.tier == EXACT

    def rel_total(self, k: int = 0) -> float:
        return self.rel + self.per_term * k


def exact(reason: str) -> Bound:
    return Bound(EXACT, reason)


def bounded(reason: str, rel: float, abs: float = 0.0, per_term: float = 0.0) -> Bound:
    return Bound(BOUNDED, reason, rel=rel, abs=abs, per_term=per_term)


# ----------------------------------------------------------------------------------- the table
_ROUNDED_ONCE = "computed in f32 and rounded once (RNE); f32 has >= 2p+2 bits, so this is the correctly rounded result"
_TRANSCENDENTAL_F32 = "GPU fast approximations (ex2.approx, v_exp_f32, lg2.approx, rsqrt) are within a few ulp of f32"
_ONE_ULP_16 = "f32 result within a few f32 ulp, then rounded once to the 16-bit output: at most 1 ulp of the output"

TABLE: dict[tuple[str, str], Bound] = {
    # movement, fills, selection, masks: no arithmetic, so nothing may differ
    ("load", "*"): exact("a copy (with a dtype conversion: RNE, fp8 saturating); out-of-bounds reads give the fill"),
    ("store", "*"): exact("a copy converting to the tensor dtype (RNE, fp8 saturating); out-of-bounds writes dropped"),
    ("atomic_add", "f32"): exact("one f32 addition per element (one contribution per element)"),
    ("atomic_add_accumulate", "f32"): bounded("several blocks add into one element in an unspecified order: an f32 sum",
                                              rel=U32, per_term=U32),
    ("cast", "*"): exact("RNE between floats (fp8 saturating to its finite max), float->int32 truncating, "
                         "saturating"),
    ("fill", "*"): exact("a constant rounded once to the tile dtype"),
    ("where", "*"): exact("a selection, no arithmetic"),
    ("cmp", "*"): exact("comparisons are exact on every dtype"),
    ("logical", "*"): exact("boolean algebra on masks"),
    ("broadcast", "*"): exact("a copy of the vector along rows or columns"),
    ("causal_mask", "*"): exact("integer comparisons"),
    ("bounds_mask", "*"): exact("integer comparisons"),
    ("dropout_mask", "*"): exact("Philox4x32-10 is integer arithmetic: every backend gives the same bits"),
    ("scalar", "i32"): exact("int32 arithmetic wraps; floordiv/mod follow Python"),
    ("scalar", "f32"): exact("IEEE f32 arithmetic on scalars (no contraction)"),
    ("control", "*"): exact("loops and pipelines only move data here; the arithmetic inside is exact"),
    ("max", "*"): exact("max/min select one of their inputs (NaN-ignoring)"),
    ("min", "*"): exact("max/min select one of their inputs (NaN-ignoring)"),
    # elementwise arithmetic that rounds once
    ("neg", "*"): exact("sign flip"),
    ("abs", "*"): exact("sign clear"),
    ("relu", "*"): exact("a selection between x and 0"),
    ("add", "*"): exact(_ROUNDED_ONCE + " (FMA contraction is off)"),
    ("sub", "*"): exact(_ROUNDED_ONCE + " (FMA contraction is off)"),
    ("mul", "*"): exact(_ROUNDED_ONCE + " (FMA contraction is off)"),
    ("maximum", "*"): exact("fmax selects one of its inputs"),
    ("minimum", "*"): exact("fmin selects one of its inputs"),
    ("div", "f32"): bounded("approximate reciprocal/division allowed (__fdividef, v_rcp_f32): 2 ulp", rel=2.0 ** -21),
    ("div", "bf16"): bounded(_ONE_ULP_16, rel=EPS["bf16"], abs=TINY["bf16"]),
    ("div", "f16"): bounded(_ONE_ULP_16, rel=EPS["f16"], abs=TINY["f16"]),
    # transcendental: GPUs use hardware approximations
    **{(op, "f32"): bounded(_TRANSCENDENTAL_F32, rel=2.0 ** -20, abs=2.0 ** -100)
       for op in ("exp", "exp2", "sqrt", "rsqrt")},
    **{(op, "f32"): bounded(_TRANSCENDENTAL_F32 + "; near x = 1 the approximation's error is absolute (2^-21)",
                            rel=2.0 ** -20, abs=2.0 ** -21) for op in ("log", "log2")},
    **{(op, "f32"): bounded("composed from exp and a reciprocal: a few ulp of f32, absolute near 0",
                            rel=2.0 ** -20, abs=2.0 ** -24) for op in ("tanh", "sigmoid")},
    **{(op, dt): bounded(_ONE_ULP_16, rel=EPS[dt], abs=TINY[dt])
       for op in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid") for dt in ("bf16", "f16")},
    # reductions and matrix products: f32 accumulation in an order the backend chooses
    ("sum", "f32"): bounded("f32 accumulation in any order: (k-1) u sum|x|", rel=U32, per_term=U32),
    ("sum", "bf16"): bounded("f32 accumulation, then 1 ulp of bf16", rel=EPS["bf16"], per_term=U32),
    ("sum", "f16"): bounded("f32 accumulation, then 1 ulp of f16", rel=EPS["f16"], per_term=U32),
    ("sum", "i32"): exact("integer sums wrap and are exact in any order"),
    ("mma", "bf16"): bounded("exact products, f32 accumulation in any order (matrix units may truncate): "
                             "2u per term of |acc| + sum |a||b|", rel=2 * U32, per_term=2 * U32),
    ("mma", "f16"): bounded("exact products, f32 accumulation in any order (matrix units may truncate): "
                            "2u per term of |acc| + sum |a||b|", rel=2 * U32, per_term=2 * U32),
    **{("mma", dt): bounded("exact products of any two fp8 formats (natively, by an exact format mapping or by "
                            "exact widening: docs/fp8.md), summed in any order at FP8_SUM per term of |acc| + "
                            "sum |a||b| (Hopper's fp8 tensor cores keep about 14 bits while they sum, not f32's 24)",
                            rel=FP8_SUM, per_term=FP8_SUM) for dt in ("fp8e4m3", "fp8e5m2")},
    # kernels (bounds derived from their dtypes; scales are described in kernel_cases)
    ("gemm", "f32"): bounded("mma bound over K (relative to sum_k |a||b|)", rel=2 * U32, per_term=2 * U32),
    ("gemm", "bf16"): bounded("mma bound over K, then the store rounds to bf16 (1 ulp)", rel=EPS["bf16"],
                              per_term=2 * U32),
    ("gemm", "f16"): bounded("mma bound over K, then the store rounds to f16 (1 ulp)", rel=EPS["f16"],
                             per_term=2 * U32),
    ("gemm_fp8", "f32"): bounded("fp8 mma bound over K, then two f32 scale products (relative to "
                                 "sum_k |a||b| sa sb)", rel=FP8_SUM + 4 * U32, per_term=FP8_SUM),
    **{("gemm_fp8", dt): bounded(f"fp8 mma bound over K, two f32 scale products, then the store rounds to {dt} "
                                 "(1 ulp)", rel=EPS[dt], per_term=FP8_SUM) for dt in ("bf16", "f16")},
    ("attention_fwd.o", "bf16"): bounded(
        "P rounded to bf16 for the PV product (2^-8 each), l summed from unrounded P, O rounded to bf16: "
        "3 half-ulps of bf16, relative to sum_j softmax_j |v_j|", rel=2.0 ** -6, abs=2.0 ** -20),
    ("attention_fwd.o", "f16"): bounded(
        "P rounded to f16 for the PV product, O rounded to f16: 3 half-ulps of f16 relative to "
        "sum_j softmax_j |v_j|", rel=2.0 ** -9, abs=2.0 ** -20),
    ("attention_fwd.lse", "f32"): bounded(
        "f32 scores, exp2/log2 approximations and an f32 row sum: absolute error in the log domain",
        rel=2.0 ** -20, abs=2.0 ** -16, per_term=U32),
    # softcap c: the logit is c * tanh(s / c), tanh within 2^-20 relative (its own entry above) and c <= 64 in the
    # suite, so each logit moves by up to 2^-14 more than without it: the lse's absolute bound grows to 2^-13; the
    # output's relative bounds (2^-6, 2^-9) are far above the 2^-14 this moves P by.
    ("attention_fwd.softcap.lse", "f32"): bounded(
        "attention_fwd.lse's f32 scores, exp2/log2 and row sum, plus tanh's 2^-20 relative error times the cap "
        "(c <= 64): absolute error in the log domain", rel=2.0 ** -20, abs=2.0 ** -13, per_term=U32),
    # attention backward. P is recomputed in f32 as exp2(c·s - log2(e)·lse): for the suite's inputs (|q|, |k| <= 2,
    # D <= 128) the f32 score (mma over D: 2u·D·sum|q||k|·c <= 2^-10.9) and the lse/scale roundings move the
    # exponent by < 2^-10.4, so P is within 2^-10 relative (exp2's own 2^-20 included). Sums over the query
    # rows (dk, dv) or key blocks (dq, atomics included) and over D (dP, delta) are f32: 2u per term.
    **{("attention_bwd.dv", dt): bounded(
        "dV = Pᵀ dO: P within 2^-10 in f32, rounded to the input dtype for the mma (half an ulp), f32 sums, dV "
        "rounded once (half an ulp): relative to sum_i P_ij |dO_i|", rel=EPS[dt] + 2.0 ** -10, abs=2.0 ** -20,
        per_term=2 * U32) for dt in ("bf16", "f16")},
    **{("attention_bwd.dq_dk", dt): bounded(
        "dS = P (dP - delta) with O given rounded (half an ulp in delta), P within 2^-10, f32 sums over D, dS "
        "rounded to the input dtype for the mma (half an ulp), f32 sums, ·scale, rounded once (half an ulp): "
        "relative to scale·sum T |q| (dk) or scale·sum T |k| (dq), T_ij = P_ij (|dO_i||v_j| + |dO_i||o_i|)",
        rel=1.5 * EPS[dt] + 2.0 ** -10 + 4 * U32, abs=2.0 ** -20, per_term=2 * U32) for dt in ("bf16", "f16")},
    **{("dropout_residual_layernorm.h", dt): bounded(
        "x * (1/(1-p)) + residual: three f32 roundings, then one rounding to the output; relative to "
        "|x/(1-p)| + |residual|", rel=EPS[dt] + 4 * U32, abs=TINY[dt]) for dt in ("bf16", "f16", "f32")},
    **{("dropout_residual_layernorm.y", dt): bounded(
        "normalises h as stored (1 ulp) with f32 row sums over d_model, then rounds y once: relative to "
        "rstd*|w|*(|h| + mean|h| + |h - mean|) + |b| + |y|", rel=2 * EPS[dt], abs=TINY[dt], per_term=2 * U32)
       for dt in ("bf16", "f16", "f32")},
    **{("dropout_residual_rmsnorm.y", dt): bounded(
        "scales h as stored (1 ulp) by an f32 root mean square over d_model, then rounds y once: relative to "
        "rstd*|w|*|h| (1 + the sum's terms) + |b| + |y|", rel=2 * EPS[dt], abs=TINY[dt], per_term=2 * U32)
       for dt in ("bf16", "f16", "f32")},
    # normalisation backward: f32 row sums over d_model (statistics, Σg, Σg·x̂), rsqrt's approximation (rstd enters
    # dh up to three times), then one rounding of the output
    **{("layernorm_bwd.dh", dt): bounded(
        "dh = rstd (g - mean g - x̂ mean(g x̂)) + dh_in with f32 row sums over d_model and an approximate rsqrt, "
        "then dx, dresidual rounded once: relative to rstd (|g| + mean|g| (1 + rstd mean|h|) + (|x̂| + rstd "
        "mean|h|) mean|g x̂|) + |dh_in| (the mean's error moves x̂ by up to rstd mean|h| times the sum's bound)",
        rel=EPS[dt] + 2.0 ** -18, abs=TINY[dt], per_term=2 * U32) for dt in ("bf16", "f16", "f32")},
    **{("layernorm_bwd.dweight", dt): bounded(
        "Σ_rows dy x̂ summed in f32 per block then over blocks, x̂ from f32 statistics over d_model: relative to "
        "Σ_rows |dy| (|x̂| + rstd mean|h|), rounded once", rel=EPS[dt] + 2.0 ** -18, abs=TINY[dt], per_term=2 * U32)
       for dt in ("bf16", "f16", "f32")},
    **{("layernorm_bwd.dbias", dt): bounded(
        "Σ_rows dy summed in f32 per block then over blocks, rounded once: relative to Σ_rows |dy|",
        rel=EPS[dt], abs=TINY[dt], per_term=2 * U32) for dt in ("bf16", "f16", "f32")},
    **{("rotary", dt): bounded(
        "x1*cos - x2*sin in f32 (three roundings; contraction allowed), then one rounding to the output: "
        "relative to |x1*cos| + |x2*sin|", rel=EPS[dt] + 4 * U32, abs=TINY[dt]) for dt in ("bf16", "f16", "f32")},
}


def _derived(kernel: str, dense: str, why: str) -> dict[tuple[str, str], Bound]:
    """A serving kernel's entries: the dense kernel's bound for each output, with the reason saying why it holds."""
    return {(f"{kernel}.{name[len(dense) + 1:]}", dt): bounded(f"{why}: {b.reason}", b.rel, b.abs, b.per_term)
            for (name, dt), b in TABLE.items() if name.startswith(dense + ".")}


# Serving attention: per row the same arithmetic as the dense kernels (the per-sequence masks select, they do not
# round). attention_kvcache adds the combine of its splits: f32 partial outputs weighted by exp(lse_s - max) and
# an f32 max + log(sum) for the lse, a few f32 ulps, far inside the 16-bit output's bound and the lse's 2^-16.
TABLE.update(_derived("attention_varlen", "attention_fwd", "the dense forward's arithmetic, per sequence"))
TABLE.update(_derived("attention_varlen_bwd", "attention_bwd", "the dense backward's arithmetic, per sequence"))
TABLE.update(_derived("attention_kvcache", "attention_fwd", "the dense forward's arithmetic per split, then the "
                      "split-KV combine in f32 (a few f32 ulps)"))


def bound_for(name: str, dtype: str) -> Bound:
    """The table's entry for (name, dtype), else (name, '*'). KeyError names what is missing."""
    for key in ((name, dtype), (name, "*")):
        if key in TABLE:
            return TABLE[key]
    raise KeyError(f"no tolerance for {name!r} with dtype {dtype!r}: add it to hk_portable/conformance/tolerances.py")
