"""The repeat-call fast path of @hk.kernel: same result as the slow path, never a stale backend."""
import pytest
import torch

import hk_portable as hk
from hk_portable.runtime import registry, selection
from hk_portable.backends.reference import ReferenceBackend
from hk_portable.interface import GL, ArgumentError


class Counting(ReferenceBackend):
    def __init__(self, name):
        self.name, self.calls = name, 0

    def launch(self, artifact, args, grid, stream=None):
        self.calls += 1
        super().launch(artifact, args, grid, stream)


@hk.kernel
def scale_rows(x: GL[2], y: GL[2], n: int, *, B: hk.const = 16):
    t = hk.load(hk.RT[hk.f32, B, B], x, (hk.block_idx(0), 0))
    hk.store(y, t * n.to(hk.f32), (hk.block_idx(0), 0))


@pytest.fixture
def two_backends(monkeypatch):
    a, b = Counting("count_a"), Counting("count_b")
    monkeypatch.setitem(registry._loaded, "count_a", a)
    monkeypatch.setitem(registry._loaded, "count_b", b)
    monkeypatch.delenv(selection.ENV, raising=False)
    return a, b


def test_context_and_environment_changes_are_honoured(two_backends, monkeypatch):
    a, b = two_backends
    x, y = torch.randn(32, 16), torch.empty(32, 16)
    with hk.use_backend("count_a"):
        scale_rows(x, y, 3, grid=(2,))
        scale_rows(x, y, 3, grid=(2,))
    assert (a.calls, b.calls) == (2, 0)
    with hk.use_backend("count_b"):
        scale_rows(x, y, 3, grid=(2,))
    assert (a.calls, b.calls) == (2, 1)
    monkeypatch.setenv(selection.ENV, "count_a")
    scale_rows(x, y, 2, grid=(2,))
    assert (a.calls, b.calls) == (3, 1)
    torch.testing.assert_close(y, x * 2, rtol=0, atol=0)


def test_fast_path_still_checks_int32_range(two_backends):
    x, y = torch.randn(16, 16), torch.empty(16, 16)
    scale_rows(x, y, 1, grid=(1,), backend="count_a")
    with pytest.raises(ArgumentError, match="'n' must be an int32"):
        scale_rows(x, y, 2**31, grid=(1,), backend="count_a")


def test_a_new_dtype_respecialises(two_backends):
    x, y = torch.randn(16, 16), torch.empty(16, 16)
    scale_rows(x, y, 2, grid=(1,), backend="count_a")
    xb, yb = x.to(torch.bfloat16), torch.empty(16, 16, dtype=torch.bfloat16)
    scale_rows(xb, yb, 2, grid=(1,), backend="count_a")
    torch.testing.assert_close(yb.float(), (xb.float() * 2).to(torch.bfloat16).float(), rtol=0, atol=0)


def test_meta_tensors_do_not_share_the_fast_key_of_cpu_tensors():
    """Both report device index -1: a meta call after CPU calls must take the slow path (its own device
    checks and artifact), not the CPU call's cached launch."""
    x, y = torch.randn(16, 16), torch.empty(16, 16)
    key = scale_rows._fast_key((x, y, 2), {}, "count_a", None)
    meta_key = scale_rows._fast_key((x.to("meta"), y.to("meta"), 2), {}, "count_a", None)
    assert key != meta_key
