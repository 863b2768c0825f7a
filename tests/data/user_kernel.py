"""A user's kernel module, for `hk compile tests/data/user_kernel.py:scale_rows` (tests/test_compile_api.py)."""
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, f32


@hk.kernel
def scale_rows(x: GL[2], w: GL[1], y: GL[2], *, BM: hk.const = 32, BN: hk.const = 64):
    m, n = hk.block_idx(0), hk.block_idx(1)
    t = hk.load(RT[f32, BM, BN], x, (m, n))
    s = hk.load(RV[f32, BM], w, (m,))
    hk.store(y, t * s[:, None], (m, n))


def example_args(device="cpu"):
    x, w = torch.randn(100, 300, device=device), torch.randn(100, device=device)
    return (x, w, torch.empty_like(x)), {"BM": 32, "BN": 64}
