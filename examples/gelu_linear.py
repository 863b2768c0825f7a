"""A tunable kernel: y = gelu(x @ w^T + bias), nn.Linear followed by tanh-GELU, in one kernel.

The README's "Tunable kernels" section is this file's kernel, word for word (tests/test_tunable.py checks it).
Compile it for any target without a device: `hk compile examples/gelu_linear.py:gelu_linear --backend hip:gfx950
--emit source`."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ST, f32

# --- README: tunable kernel ---
@hk.kernel(tunable=dict(                         # legal values only: which are fast is each backend's business
    BM=hk.tunable(range(16, 257, 16), role="m"),     # rows of y a block computes (whole 16-row mma blocks)
    BN=hk.tunable(range(16, 257, 16), role="n"),     # columns of y a block computes
    BK=hk.tunable(16, 32, 64, role="k"),             # the K step of the pipeline
    STAGES=hk.tunable(range(1, 5), role="stages"),   # shared-memory buffers of the pipeline
    num_warps=hk.tunable(4, 8, role="warps")))
def gelu_linear(x: GL[2], w: GL[2], bias: GL[1], y: GL[2], *, BM: hk.const = 64, BN: hk.const = 64,
                BK: hk.const = 32, STAGES: hk.const = 2):
    """y = gelu_tanh(x @ w^T + bias): x [M, K], w [N, K] (nn.Linear's weight), bias [N]; f32 accumulation."""
    m, n = hk.block_idx(0), hk.block_idx(1)
    x_s = hk.shared(ST[x.dtype, BM, BK], stages=STAGES)
    w_s = hk.shared(ST[w.dtype, BN, BK], stages=STAGES)

    def load(k, s):                              # global -> shared for step k into buffer s
        hk.load(x_s[s], x, (m, k))               # rows and columns past the edges read 0
        hk.load(w_s[s], w, (n, k))

    def compute(k, s, acc):                      # reads only buffer s; returns the new carry
        return hk.mma_ABt(x_s[s], w_s[s], acc)

    acc = hk.pipeline(hk.cdiv(x.shape[1], BK), load, compute, carry=hk.zeros(RT[f32, BM, BN]), stages=STAGES)
    h = acc + hk.load(RV[f32, BN], bias, (n,))[None, :]          # the epilogue, on the accumulator in registers
    g = 0.5 * h * (1.0 + hk.tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)))    # sqrt(2/pi)
    hk.store(y, g.to(y.dtype), (m, n))


def linear_gelu(x, w, bias, out=None, backend=None):
    """gelu(x @ w.T + bias) into `out` (or a fresh tensor); the grid follows the tile the backend chose."""
    y = x.new_empty(x.shape[0], w.shape[0]) if out is None else out
    gelu_linear(x, w, bias, y, backend=backend,
                grid=lambda cfg: (hk.cdiv(x.shape[0], cfg["BM"]), hk.cdiv(w.shape[0], cfg["BN"])))
    return y
# --- end ---


def reference(x, w, bias):
    """The same expression in float64 torch (tanh-GELU)."""
    return torch.nn.functional.gelu(x.double() @ w.double().t() + bias.double(), approximate="tanh")


def example_args(device="cpu", M=256, N=256, K=256, dtype=torch.bfloat16):
    """(x, w, bias, y) and the consts for `hk compile`: none, so each target's choice is compiled."""
    x = torch.randn(M, K, device=device, dtype=dtype)
    w = torch.randn(N, K, device=device, dtype=dtype)
    bias = torch.randn(N, device=device, dtype=dtype)
    return (x, w, bias, torch.empty(M, N, device=device, dtype=dtype)), {}
