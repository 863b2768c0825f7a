"""Kernel names never reach generated source, symbols, comments or file names raw (issue 14, item 1).

A name is mangled into a C identifier (interface/names.c_symbol); the generated CUDA and HIP sources must
show that symbol and nothing of the raw name, compile offline, and run (reference, emulated gfx942)."""
from __future__ import annotations

import re

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, f32
from hk_portable.interface.names import MAX_SYMBOL, c_symbol

INJECTION = 'a(){} __global__ void evil'
HOSTILE = {
    "injection": INJECTION,
    "quotes": 'say "hi" it\'s',
    "newline": "line1\nvoid evil() {}\n//",
    "comment_end": "x */ void evil() { /*",
    "line_comment": "x // y",
    "backslash": "tail\\",
    "path": "../../etc/passwd",
    "unicode": "ядро_ñ_核\u2028",
    "long": "k" * 500,
    "digit": "9lives",
    "keyword": "int",
    "reserved": "__global__",
    "empty_after_mangle": "!!!",
    "double_underscore": "a__b",
    "macro": "assert",
}
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@pytest.mark.parametrize("name", list(HOSTILE.values()), ids=list(HOSTILE))
def test_symbol_is_a_safe_stable_identifier(name):
    sym = c_symbol(name)
    assert IDENT.match(sym) and len(sym) <= MAX_SYMBOL
    assert "__" not in sym and sym not in ("int", "main", "assert")
    assert c_symbol(name) == sym and c_symbol(sym) == sym        # stable, and a fixed point


def test_safe_names_stay_readable_and_distinct_names_stay_distinct():
    assert c_symbol("gemm_kernel") == "gemm_kernel"
    assert c_symbol("my-kernel").startswith("my_kernel_")
    assert c_symbol("k" * 500).startswith("k" * 40)
    names = {"a-b", "a_b", "a.b", "a b", "k" * 500, "k" * 501, "ядро", "ядра", *HOSTILE.values()}
    assert len({c_symbol(n) for n in names}) == len(names)


def _scale(x: GL[2], y: GL[2], *, BM: hk.const = 16, BN: hk.const = 32):
    m, n = hk.block_idx(0), hk.block_idx(1)
    t = hk.load(RT[f32, BM, BN], x, (m, n))
    hk.store(y, t * 2.0, (m, n))


def _kernel(name):
    return hk.kernel(_scale, name=name)


def _args(device="cpu"):
    x = torch.randn(32, 64, device=device)
    return x, torch.full_like(x, float("nan"))


def _assert_source_is_safe(source: str, name: str):
    sym = c_symbol(name)
    assert re.search(rf"\bvoid {sym}\(", source), "the generated kernel must be declared with the mangled symbol"
    if name != sym:
        assert name not in source
    assert not re.search(r"\bevil\b", source)          # only inside the one symbol
    for line in source.splitlines():
        if "// ---- kernel" in line or "backend: kernel" in line:
            assert sym in line


@pytest.mark.parametrize("key", list(HOSTILE), ids=list(HOSTILE))
def test_reference_runs_and_ir_is_one_line(key):
    name = HOSTILE[key]
    k = _kernel(name)
    x, y = _args()
    k(x, y, grid=(2, 2), backend="reference")
    torch.testing.assert_close(y, x.double().mul(2).float(), rtol=0, atol=0)
    text, plain = str(k.trace(x, y)), str(_kernel("plain").trace(x, y))
    assert text.splitlines()[1:] == plain.splitlines()[1:]      # the name stays on the header line
    assert text.splitlines()[0].startswith("kernel @")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("key", ["injection", "newline", "comment_end", "unicode", "long", "path"])
def test_cuda_offline_source_shows_the_safe_symbol(key, arch):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    name = HOSTILE[key]
    x, y = _args("meta")
    art = _kernel(name).compile(x, y, backend=f"cuda:{arch}")
    _assert_source_is_safe(art.source, name)
    assert art.kernel_name == c_symbol(name)
    if art.asm is not None:            # NVRTC compiled it: the PTX entry is the symbol, nothing else
        entries = re.findall(r"\.entry\s+(\w+)", art.asm)
        assert entries == [c_symbol(name)]


@pytest.mark.parametrize("key", ["injection", "newline", "path", "unicode", "long"])
def test_hip_offline_source_and_isa_show_the_safe_symbol(key):
    name = HOSTILE[key]
    x, y = _args("meta")
    art = _kernel(name).compile(x, y, backend="hip:gfx942")
    _assert_source_is_safe(art.source, name)
    assert art.kernel_name == c_symbol(name)
    if art.asm is None:
        pytest.skip(f"no offline AMDGPU compiler: {art.resources.get('offline')}")
    assert re.search(rf"^{c_symbol(name)}:", art.asm, re.M)
    assert not re.search(r"\bevil\b", art.asm)


@pytest.mark.parametrize("key", ["injection", "path"])
def test_hip_emulated_runs_a_hostile_name(key):
    k = _kernel(HOSTILE[key])
    x, y = _args()
    try:
        k(x, y, grid=(2, 2), backend="hip:gfx942:emulated")
    except hk.interface.BackendError as e:
        pytest.skip(f"the hip emulator cannot run here: {e}")
    torch.testing.assert_close(y, x.double().mul(2).float(), rtol=0, atol=0)


def test_cli_emit_source_shows_the_safe_symbol(tmp_path, capsys):
    from hk_portable.cli import main
    mod = tmp_path / "hostile_user.py"
    mod.write_text(
        "import torch\nimport hk_portable as hk\nfrom hk_portable.interface import GL, RT, f32\n\n"
        f"def _f(x: GL[2], y: GL[2]):\n    t = hk.load(RT[f32, 16, 32], x, (hk.block_idx(0), hk.block_idx(1)))\n"
        f"    hk.store(y, t, (hk.block_idx(0), hk.block_idx(1)))\n\n"
        f"k = hk.kernel(_f, name={INJECTION!r})\n\n"
        "def example_args(device='cpu'):\n    x = torch.randn(32, 64, device=device)\n"
        "    return (x, torch.empty_like(x)), {}\n")
    assert main(["compile", f"{mod}:k", "--backend", "hip:gfx942", "--emit", "source"]) == 0
    _assert_source_is_safe(capsys.readouterr().out, INJECTION)


@pytest.mark.parametrize("bad", [b"bytes", 3, ""], ids=["bytes", "int", "empty"])
def test_a_name_must_be_a_nonempty_string(bad):
    with pytest.raises(TypeError, match="name"):
        hk.kernel(_scale, name=bad)


@pytest.mark.gpu
def test_a_hostile_name_runs_on_the_gpu():
    """The driver looks the kernel up by its mangled symbol (cuda moduleGetFunction, hip hipModuleGetFunction)."""
    from hk_portable.runtime import registry
    spec = next((s for s in ("cuda", "hip") if registry.load(s).status().available), None)
    if spec is None:
        pytest.skip("no usable GPU backend")
    x, y = _args("cuda")
    _kernel(INJECTION)(x, y, grid=(2, 2), backend=spec)
    torch.testing.assert_close(y, x.double().mul(2).float(), rtol=0, atol=0)
