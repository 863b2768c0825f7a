"""The ISA analyser's cost model (analyze.py): what an instruction costs on a SIMD and what the matrix cores could
do at their peak, and from them a loop's clocks and its two bounds.

  * `bound`: MFMA clocks / max(MFMA, VALU, LDS clocks), the MFMA clocks those of the instructions the compiler
    chose. It says whether anything but the matrix core limits issue; a loop of half-rate MFMA forms reads 1.0.
  * `bound_vs_peak`: the loop's MFMA FLOPs at the arch's peak rate for their operand kind (archs.Arch.mfma_peak)
    / max(MFMA, VALU, LDS clocks): the fraction of the chip's matrix peak the loop could reach if nothing but
    instruction issue limited it. It is `bound` x `form_efficiency`, the fraction of peak the MFMA forms used
    reach (0.5 for 16x16x16 bf16 on gfx950, whose 16x16x32 form does twice the work in the same 16 cycles).

Costs, per wave on one SIMD: MFMA cycles from the arch's row (archs.Arch.mfma_cycles; its comment cites the
sources); VALU a wave64 instruction over a 16-lane SIMD, 4 cycles (CDNA3 white paper; MI300X: 304 CUs * 4 SIMDs *
16 lanes * 2 flop * 2.1 GHz = 81.7 TFLOP/s f32 vector); transcendentals and 32-bit integer multiplies at quarter
rate (LLVM SISchedule.td: WriteTrans32 and WriteQuarterRate32 take 4x Write32Bit); LDS the row's bytes per clock
per CU, a SIMD's share a quarter (every SIMD running the same loop).
"""
from __future__ import annotations

import re

from .archs import ARCHS

SIMDS_PER_CU = 4
VALU_CYCLES = 4
QUARTER_RATE_CYCLES = 16
TRANSCENDENTAL = re.compile(r"^v_(exp|log|rcp|rsq|sqrt|sin|cos)(_|$)")
QUARTER_RATE = re.compile(r"^v_(mul_lo_u32|mul_lo_i32|mul_hi_u32|mul_hi_i32|mad_u64_u32|mad_i64_i32)(_|$)")

# v_mfma_f32_16x16x16_bf16, v_mfma_f32_4x4x4_16b_f16 (16 blocks), v_smfmac_f32_16x16x32_f16, v_mfma_scale_...
_MFMA_SHAPE = re.compile(r"^v_(mfma|smfmac)_\w+?_(\d+)x(\d+)x(\d+)_?(?:(\d+)b_)?(\w*)$")
# the operand kind an instruction kind's peak is read under: f8f6f4 is costed with fp8 operands (its cbsz/blgp
# operand types are not read; FP6/FP4 operands would run twice as fast)
PEAK_KIND = {"f8f6f4": "f8"}


def mfma_form(op: str) -> tuple[tuple[int, int, int], str, int, bool] | None:
    """((M, N, K), instruction kind as the arch tables key it, blocks, sparse) of an MFMA mnemonic; None if the
    mnemonic names no shape."""
    m = _MFMA_SHAPE.match(op)
    if not m:
        return None
    shape, blocks, kind = tuple(int(g) for g in m.groups()[1:4]), int(m.group(5) or 1), m.group(6)
    kind = ("f16" if kind.startswith(("f16", "bf16")) else "xf32" if kind.startswith("xf32") else
            "f8f6f4" if kind.startswith("f8f6f4") else "f8" if re.match(r"(fp8|bf8)", kind) else
            "i8" if kind.startswith("i8") else kind or "f32")
    if op.startswith("v_mfma_f64"):
        kind = "f64"
    return shape, kind, blocks, m.group(1) == "smfmac"


def mfma_cycles(op: str, arch: str) -> tuple[int, bool]:
    """(cycles, known) of an MFMA; an unknown variant is costed by its output shape (16x16: 16, 32x32: 32)."""
    form = mfma_form(op)
    if form is None:
        return 16, False
    shape, kind, blocks, _ = form
    cycles = ARCHS[arch].mfma_cycles.get((*shape, kind)) if blocks == 1 else None
    return (cycles, True) if cycles else (16 if shape[0] <= 16 else 32, False)


def mfma_flops(op: str) -> int:
    """FLOPs (int8: OPs) of one MFMA of a wave: 2*M*N*K per block. A sparse smfmac's A is 4:2 structured (half its
    K entries zero by construction), so it counts the products it computes, M*N*K: at the dense peak it reads as
    the dense form it replaces, and sparsity is not credited as speed."""
    form = mfma_form(op)
    if form is None:
        return 0
    (m, n, k), _, blocks, sparse = form
    return blocks * m * n * k * (1 if sparse else 2)


def mfma_peak(op: str, arch: str) -> int | None:
    """The arch's peak FLOP per clock per SIMD for the operand kind of `op`; None if the row lists none."""
    form = mfma_form(op)
    if form is None:
        return None
    return ARCHS[arch].mfma_peak.get(PEAK_KIND.get(form[1], form[1]))


def clocks(c: dict, arch: str) -> dict:
    """MFMA, VALU and LDS clocks per wave and iteration of a count (analyze.count); the bound against the chosen
    instructions (`bound`) and against the arch's peak (`bound_vs_peak`), what limits them, the MFMA FLOPs, the
    clocks they take at peak and the forms' efficiency (see the module docstring)."""
    mfma, flops, at_peak, unknown, no_peak, forms = 0, 0, 0.0, [], [], {}
    for op, n in c["mfma"].items():
        cyc, known = mfma_cycles(op, arch)
        mfma += n * cyc
        if not known:
            unknown.append(op)
        peak = mfma_peak(op, arch)
        flops += n * mfma_flops(op)
        if peak:
            at_peak += n * mfma_flops(op) / peak
            forms[op] = round(mfma_flops(op) / peak / cyc, 4)
        else:
            no_peak.append(op)
    n = c["counts"]
    valu = ((n.get("valu", 0) - c["quarter_rate_valu"]) * VALU_CYCLES
            + (c["quarter_rate_valu"] + n.get("trans", 0)) * QUARTER_RATE_CYCLES)
    lds = c["lds_cost_bytes"] / (ARCHS[arch].lds_bytes_per_clock / SIMDS_PER_CU)
    out = {"mfma": mfma, "valu": valu, "lds": round(lds, 1)}
    worst = max(out, key=lambda k: out[k])
    out["bound"] = round(mfma / out[worst], 4) if mfma else 0.0
    out["limiter"] = worst if mfma else "no MFMA"
    out["valu_to_mfma"] = round(valu / mfma, 3) if mfma else None
    out["lds_to_mfma"] = round(lds / mfma, 3) if mfma else None
    if mfma:
        peaked = not no_peak
        out["mfma_flops"] = flops
        out["peak_clocks"] = round(at_peak, 1) if peaked else None
        out["form_efficiency"] = round(at_peak / mfma, 4) if peaked else None
        out["form_efficiency_by_op"] = forms
        out["bound_vs_peak"] = round(at_peak / out[worst], 4) if peaked else None
    if unknown:
        out["mfma_cost_guessed"] = sorted(unknown)
    if no_peak:
        out["mfma_peak_unknown"] = sorted(no_peak)
    return out


def table(arch: str) -> dict:
    """The costs an analysis of `arch` used (its report's `costs`)."""
    row = ARCHS[arch]
    return {"mfma_cycles": {f"{m}x{n}x{kk} {t}": c for (m, n, kk, t), c in row.mfma_cycles.items()},
            "mfma_peak_flop_per_clock_per_simd": dict(row.mfma_peak),
            "valu_cycles": VALU_CYCLES, "quarter_rate_cycles": QUARTER_RATE_CYCLES,
            "lds_bytes_per_clock_per_cu": row.lds_bytes_per_clock}
