"""The autotuner (runtime/tuning.py): candidates timed through the wrapper's launcher, the winner stored per
shape bucket as plain JSON in the cache directory and reused by the next process without timing."""
from __future__ import annotations

import json
import time

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, f32
from hk_portable.kernels import gemm as gemm_mod
from hk_portable.runtime import tuning

from hk_test_plugins import RECORDING_BACKEND


@pytest.fixture
def tuning_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HK_CACHE_DIR", str(tmp_path))
    tuning.forget()
    gemm_mod.gemm_kernel._configs.clear()
    yield tmp_path
    tuning.forget()
    gemm_mod.gemm_kernel._configs.clear()


def _args(M=96, N=80, K=64):
    return (torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16),
            torch.empty(M, N))


CANDS = [dict(gemm_mod.DEFAULT_CONFIG, BM=32, BN=32), dict(gemm_mod.DEFAULT_CONFIG, BM=64, BN=64)]


def _fake_launch(slow_bm, calls):
    """A launcher whose time depends on the config: the one with BM == slow_bm is slow."""
    def launch(cfg):
        calls.append(cfg["BM"])
        time.sleep(0.004 if cfg["BM"] == slow_bm else 0.0)
    return launch


def test_shape_buckets_round_up_to_powers_of_two():
    assert tuning.bucket(1, 2, 3, 1000, 1024, 1025) == (1, 2, 4, 1024, 1024, 2048)


def test_tuning_times_every_candidate_and_stores_the_fastest(tuning_dir):
    calls = []
    cfg = gemm_mod.gemm_kernel.choose_config(CANDS, *_args(), backend="reference", launch=_fake_launch(32, calls),
                                             bucket=(128, 128, 64), tune=True)
    assert cfg == CANDS[1] and set(calls) == {32, 64}
    assert len(calls) == 2 * (tuning.WARMUP + tuning.REPEATS)
    data = json.loads((tuning_dir / tuning.FILE).read_text())
    (entry,) = data.values()
    assert entry["config"] == CANDS[1] and len(entry["ms"]) == 2 and entry["tuning_seconds"] < 60


def test_a_stored_winner_is_used_by_the_next_process_without_timing(tuning_dir):
    gemm_mod.gemm_kernel.choose_config(CANDS, *_args(), backend="reference", launch=_fake_launch(64, []),
                                       bucket=(128, 128, 64), tune=True)
    tuning.forget()                                    # a new process: no memory, only the file
    gemm_mod.gemm_kernel._configs.clear()

    def must_not_run(cfg):
        raise AssertionError("a stored winner must not be timed again")
    cfg = gemm_mod.gemm_kernel.choose_config(CANDS, *_args(), backend="reference", launch=must_not_run,
                                             bucket=(128, 128, 64), tune=True)
    assert cfg == CANDS[0]
    other = gemm_mod.gemm_kernel.choose_config(CANDS, *_args(), backend="reference", launch=None,
                                               bucket=(256, 128, 64))
    assert other == CANDS[-1], "another bucket, tuning off: the backend's default"


def test_a_corrupt_or_foreign_tuning_file_is_ignored(tuning_dir):
    (tuning_dir / tuning.FILE).write_text("{not json")
    assert gemm_mod.gemm_kernel.choose_config(CANDS, *_args(), backend="reference", bucket=(1, 2, 3)) == CANDS[-1]
    key = tuning.key("gemm_kernel", "reference", "reference:cpu", [], (1, 2, 3), CANDS)
    (tuning_dir / tuning.FILE).write_text(json.dumps({key: {"config": {"BM": 7}}, "x": [1]}))
    assert tuning.lookup(key, CANDS) is None, "a winner that is not a candidate is not used"


def test_tuning_is_off_by_default_and_never_times_a_compile_only_target(tuning_dir, monkeypatch):
    monkeypatch.delenv(tuning.ENV, raising=False)
    calls = []
    gemm_mod.gemm_kernel.choose_config(CANDS, *_args(), backend="reference", launch=_fake_launch(32, calls),
                                       bucket=(128, 128, 64))
    assert calls == []
    meta = [torch.empty(s, dtype=d, device="meta") for s, d in (((96, 64), torch.bfloat16), ((64, 80), torch.bfloat16),
                                                                ((96, 80), torch.float32))]
    gemm_mod.gemm_kernel.choose_config(gemm_mod.candidates({}), *meta, backend="cuda:sm_90a",
                                       launch=_fake_launch(32, calls), bucket=(128, 128, 64), tune=True)
    assert calls == [], "no device: nothing is timed"


def test_the_gemm_wrapper_tunes_under_HK_AUTOTUNE_and_stays_correct(tuning_dir, monkeypatch):
    monkeypatch.setenv(tuning.ENV, "1")
    a, b, out = _args(100, 70, 90)
    out.fill_(float("nan"))
    hk.kernels.gemm.gemm(a, b, out, backend="reference")
    ref = a.double() @ b.double()
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-5
    data = json.loads((tuning_dir / tuning.FILE).read_text())
    assert len(data) == 1 and "gemm_kernel" in next(iter(data))


def test_a_rejected_build_gives_way_to_the_next_configuration(fake_plugins):
    """Backend.rejects: the chosen candidate's build is passed over for the next candidate, then the kernel's
    fallbacks, in order; the note says which and why. A backend that judges nothing keeps its choice."""
    fake_plugins.module("hk_fake_backends", RECORDING_BACKEND)
    fake_plugins.distribution("judging-dist", {"judging": "hk_fake_backends:Judging"})
    x = torch.randn(8, 8)

    @hk.kernel
    def k(x: GL[2], *, BM: hk.const = 64, S: hk.const = 1):
        hk.store(x, hk.load(RT[f32, 8, 8], x, (0, 0)), (0, 0))

    # the default choice is the baseline (last candidate): BM=64, rejected; no later candidate: the fallbacks
    got = k.choose_config([dict(BM=64, S=2), dict(BM=64, S=1)], x, backend="judging",
                          fallbacks=[dict(BM=64, S=3), dict(BM=32, S=1), dict(BM=16, S=1)])
    assert got == dict(BM=32, S=1)
    (note,) = k.config_notes.values()
    assert "took {'BM': 32, 'S': 1}" in note and note.count("spills 8 bytes") == 2
    assert k.compile(x, backend="judging", BM=32, S=1).options["passed_over"] == note     # on the Artifact too
    # every build rejected: the choice stays (and a warning is logged)
    assert k.choose_config([dict(BM=64, S=1)], x, backend="judging", fallbacks=[dict(BM=64, S=5)]) == dict(BM=64, S=1)
    # the reference judges no build
    assert k.choose_config([dict(BM=64, S=1)], x, backend="reference", fallbacks=[dict(BM=32, S=1)]) == dict(BM=64,
                                                                                                              S=1)
