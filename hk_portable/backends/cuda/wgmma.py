"""The wgmma instructions a kernel needs, rendered as device-library specialisations (sm_90a).

`wgmma.mma_async ... m64nNk16` (k32 for fp8) names its N accumulator registers one by one (N/2 per thread), so each
width is its own inline-asm statement, in two forms: A from a shared-memory descriptor (`wgmma_op`) and A
from registers (`wgmma_op_rs`). Rather than carry all 32 widths x 2 dtypes in the library
(slow NVRTC compiles for every kernel), the codegen renders `hk::wgmma_op<T, N>` for the (dtype, N)
pairs of the Program's mma ops. Which mma ops actually take wgmma is the library's decision
(`wgmma_fits` in hk_cuda/wgmma.cuh); rendering a superset costs nothing, since an unused
specialisation is never instantiated.
"""
from __future__ import annotations

from ...interface.ir import Program

PTX_TYPE = {"bf16": "bf16", "f16": "f16", "fp8e4m3": "e4m3", "fp8e5m2": "e5m2"}
CTYPE = {"bf16": "bf16", "f16": "f16", "fp8e4m3": "fp8e4m3", "fp8e5m2": "fp8e5m2"}
FP8 = ("fp8e4m3", "fp8e5m2")
MAX_N = 256


def widths(program: Program) -> list[tuple[str, str, int]]:
    """(dtype of a, dtype of b, N) of every mma in the Program that a wgmma m64nNk16 (k32 for fp8) could
    compute."""
    out = set()
    for op in program.body.walk():
        if op.opcode != "mma":
            continue
        da, db = op.operands[0].type.dtype.name, op.operands[1].type.dtype.name
        n = op.results[0].type.cols
        if da in PTX_TYPE and n % 8 == 0 and n <= MAX_N:
            out.add((da, db, n))
    return sorted(out)


def render_fp8(da: str, db: str, n: int) -> str:
    """fp8: k32, both operands K-major from descriptors (the instruction has no transpose operands)."""
    regs = n // 2
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    a, b, scale = regs, regs + 1, regs + 2
    return (
        f"template <> struct wgmma_op8<{CTYPE[da]}, {CTYPE[db]}, {n}> {{\n"
        f"    static HK_DEV void run(float* d, u64 desc_a, u64 desc_b) {{\n"
        f"        asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{scale}, 0;\\n\"\n"
        f"                     \"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.{PTX_TYPE[da]}.{PTX_TYPE[db]} {{{d}}}, "
        f"%{a}, %{b}, p, 1, 1;\\n}}\\n\"\n"
        f"                     : {outs}\n"
        f"                     : \"l\"(desc_a), \"l\"(desc_b), \"r\"(1));\n"
        f"    }}\n"
        f"}};\n")


def render_one(dtype: str, n: int) -> str:
    regs = n // 2
    t = PTX_TYPE[dtype]
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    a, b, scale, ta, tb = regs, regs + 1, regs + 2, regs + 3, regs + 4
    return (
        f"template <> struct wgmma_op<{CTYPE[dtype]}, {n}> {{\n"
        f"    template <int TA, int TB> static HK_DEV void run(float* d, u64 desc_a, u64 desc_b) {{\n"
        f"        asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{scale}, 0;\\n\"\n"
        f"                     \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{d}}}, %{a}, %{b}, p, 1, 1, "
        f"%{ta}, %{tb};\\n}}\\n\"\n"
        f"                     : {outs}\n"
        f"                     : \"l\"(desc_a), \"l\"(desc_b), \"r\"(1), \"n\"(TA), \"n\"(TB));\n"
        f"    }}\n"
        f"}};\n")


def render_rs(dtype: str, n: int) -> str:
    """The register-A form: A's four 32-bit fragments per thread (mma.sync's A layout per warp), B from a
    descriptor; there is no trans-a operand."""
    regs = n // 2
    t = PTX_TYPE[dtype]
    d = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    a = ", ".join(f"%{regs + i}" for i in range(4))
    b, scale, tb = regs + 4, regs + 5, regs + 6
    return (
        f"template <> struct wgmma_op_rs<{CTYPE[dtype]}, {n}> {{\n"
        f"    template <int TB> static HK_DEV void run(float* d, const u32 (&a)[4], u64 desc_b) {{\n"
        f"        asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{scale}, 0;\\n\"\n"
        f"                     \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{d}}}, {{{a}}}, %{b}, p, 1, 1, "
        f"%{tb};\\n}}\\n\"\n"
        f"                     : {outs}\n"
        f"                     : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(desc_b), \"r\"(1), \"n\"(TB));\n"
        f"    }}\n"
        f"}};\n")


def render(program: Program) -> str:
    """The specialisations for this Program (empty when it has no wgmma-sized mma)."""
    parts = [render_fp8(da, db, n) if da in FP8 else render_one(da, n) + render_rs(da, n)
             for da, db, n in widths(program)]
    if not parts:
        return ""
    return "#ifdef HK_WGMMA\nnamespace hk {\n" + "".join(parts) + "}  // namespace hk\n#endif\n"
