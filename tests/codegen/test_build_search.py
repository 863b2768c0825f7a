"""The shared build-variant search (codegen/build_search.py): plan changes tried in order, kept by the rule, each try
recorded, refusals recorded, and never more compiles than the cap."""
from __future__ import annotations

import pytest

from hk_portable.codegen.build_search import MAX_COMPILES, Build, Search


class Refused(Exception):
    pass


def _compiler(spills: dict, compiled: list):
    def build(spec: dict) -> Build:
        compiled.append(spec["n"])
        if spec["n"] == "bad":
            raise Refused("too few registers")
        return Build(spec, spec["n"], {"spill_stores": spills[spec["n"]], "stack_bytes": 0, "registers": 64})
    return build


def fewer(c: Build, k: Build) -> bool:
    return c.resources["spill_stores"] < k.resources["spill_stores"]


def test_changes_are_kept_by_the_rule_and_recorded():
    compiled = []
    s = Search(_compiler({"a": 8, "b": 16, "c": 0}, compiled), refusals=(Refused,))
    s.start({"n": "a"})
    assert not s.consider("worse", {"n": "b"}, fewer) and s.kept.products == "a" and s.last.products == "b"
    assert not s.consider("refused", {"n": "bad"}, fewer) and s.last is None
    assert s.consider("better", {"n": "c"}, fewer) and s.kept.products == "c"
    assert compiled == ["a", "b", "bad", "c"]
    rec = s.record()
    assert [(t["change"], t["kept"]) for t in rec] == [("plan", True), ("worse", False), ("refused", False),
                                                       ("better", True)]
    assert rec[0]["spill_stores"] == 8 and "too few registers" in rec[2]["refused"]


def test_a_search_never_compiles_past_its_cap():
    compiled = []
    s = Search(_compiler({"a": 8}, compiled), cap=3)
    s.start({"n": "a"})
    for k in range(5):
        s.consider(f"try {k}", {"n": "a"}, fewer)
    assert len(compiled) == 3 and s.compiles == 3
    assert [t.get("skipped", "") != "" for t in s.record()] == [False, False, False, True, True, True]


def test_an_unexpected_error_is_not_a_refusal():
    s = Search(_compiler({"a": 8}, []), refusals=(KeyError,))
    s.start({"n": "a"})
    with pytest.raises(Refused):
        s.consider("bad", {"n": "bad"}, fewer)


def test_the_cuda_ladder_stays_under_the_cap_and_records_its_tries():
    """The 64x64 causal attention block on sm_90a (offline NVRTC): its build takes the SM fill (a capped build),
    so the record shows the plan, then the fill's try kept."""
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy (with NVRTC) is not installed")
    import hk_portable as hk
    from hk_portable.kernels import attention
    be = hk.get_backend("cuda")
    args, consts = attention.example_args(D=64, causal=True)
    art = be.compile(attention.attention_fwd_kernel.trace(*args, **consts), be.target("sm_90a"))
    tries = art.options["build_tries"]
    assert tries[0]["change"] == "plan" and len(tries) <= MAX_COMPILES
    assert [t for t in tries if t["kept"]][-1]["change"].startswith("min_blocks=") == (
        art.options["launch_bounds_min_blocks"] not in (None, 1))
