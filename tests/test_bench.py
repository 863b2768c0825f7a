"""`hk bench`'s harness on the CPU: each case times its own inputs, both self-checks fire on planted faults,
and a small run on the reference backend produces correct, complete entries."""
from __future__ import annotations

import json
import time

import torch

from hk_portable import bench as B


def _entry(family, work, ms, sweep=()):
    t = {"ms": ms, "ms_batch": ms, "agree": True, "spread": 0.0, "rate": work / ms}
    return {"family": family, "name": f"{family} {work} {sweep}", "work": work, "unit": "TFLOP/s", "hk": t,
            "baselines": {}, "sweep": list(sweep)}


def test_each_case_runs_on_its_own_inputs():
    """The old bench built lambdas over loop variables, so every case timed the family's last shape."""
    cases = [B.gemm_case(32, 48, 16), B.gemm_case(64, 16, 32)]
    outs = [c.make("cpu").hk(0) for c in cases]
    assert [tuple(o.shape) for o in outs] == [(32, 48), (64, 16)]


def test_scaling_check_catches_equal_times_for_different_sizes():
    same = [_entry("gemm", 1e9, 5.0), _entry("gemm", 8e9, 5.0)]
    assert B.scaling_problems(same)
    scaled = [_entry("gemm", 1e9, 5.0), _entry("gemm", 8e9, 38.0)]
    assert not B.scaling_problems(scaled)
    # causal and non-causal attention are different sweeps: their times are not compared
    other_sweeps = [_entry("attention", 2e9, 5.0, (128, False)), _entry("attention", 1e9, 5.0, (128, True))]
    assert not B.scaling_problems(other_sweeps)


def test_the_two_timing_methods_must_agree():
    t = B.Timing(1.0, 1.5, True)
    assert t.spread > B.AGREE
    calls = []
    t = B.time_fn(lambda i: calls.append(i), 3, "cpu", budget_s=0.01)
    assert set(calls) == {0, 1, 2} and t.ms > 0 and t.ms_batch > 0


def test_side_by_side_rounds_share_a_drifting_clock():
    """A device that slows as it runs (clocks under load) must not bias a ratio: hk and its baselines are timed in
    interleaved rounds. Timed one after the other, b (twice a's cost) reads about 3x a here."""
    slow = [1.0]

    def costing(ms):
        def fn(i):
            slow[0] *= 1.01
            time.sleep(ms * slow[0] * 1e-3)
        return fn
    t = B.time_side_by_side({"a": costing(1.0), "b": costing(2.0)}, 1, "cpu", budget_s=0.05)
    assert slow[0] > 2.0                                     # the drift was large
    assert 1.6 < t["b"].ms / t["a"].ms < 2.5
    assert all(x.agree for x in t.values())
    assert len(t["a"].rounds_ms) == B.ROUNDS and t["a"].rounds_ms[-1] > 1.5 * t["a"].rounds_ms[0]   # the drift shows


def test_a_small_run_on_the_reference_is_correct_and_complete(tmp_path):
    torch.manual_seed(0)
    cases = [B.gemm_case(40, 24, 40), B.attention_case(1, 4, 2, 48, 64, True), B.layernorm_case(8, 96)]
    report = B.run(cases, "cpu", "reference", budget_s=0.02, progress=False)
    for e in report["results"]:
        assert "error" not in e, e
        assert e["rel_error"] < 1e-2, e
        assert e["hk"]["ms"] > 0 and e["baselines"] and e["ratio_hk_over_baseline"] > 0
        p10, p50, p90 = e["hk"]["per_call_p10_p50_p90_ms"]
        assert 0 < p10 <= p50 <= p90 and p10 <= e["hk"]["ms"] <= p90     # around the per-call median
        assert 0 < e["hk"]["host_ms_per_call"] <= e["hk"]["ms_batch"] * 1.01   # synchronous on the CPU: all host
    path = tmp_path / "bench.json"
    B.to_json(report, str(path))
    assert json.loads(path.read_text())["results"][1]["Hkv"] == 2
    assert "gemm bf16 40x24x40" in B.table(report)
    assert [p.endswith(".png") for p in B.plot(report, str(tmp_path / "b"))] == [True] * 3
    assert len(B.plot(report, str(tmp_path / "new" / "folder" / "b"))) == 3        # a --plot folder not made yet


def test_hk_bench_cli_runs_a_filtered_case(tmp_path, capsys):
    from hk_portable.cli import main
    rc = main(["bench", "--device", "cpu", "--backend", "reference", "-k", "gemm bf16 64x64", "--budget", "0.01",
               "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert "gemm bf16 64x64x64" in out and rc in (0, 1)      # 1 only if the loaded CPU's timings disagree
    assert json.loads((tmp_path / "r.json").read_text())["results"][0]["rel_error"] < 1e-2


def test_per_call_events_start_behind_a_spin_kernel(monkeypatch):
    """On CUDA the per-call event pairs are enqueued behind a spin kernel (bench._head_start), so an event pair times
    the call and not the host's work before its launch. The CUDA calls are recorded by fakes here."""
    log = []

    class Event:
        def __init__(self, enable_timing):
            self.t = None

        def record(self):
            log.append("record")
            self.t = len(log)

        def elapsed_time(self, end):
            return float(end.t - self.t)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("sleep", cycles)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("sync"))
    times = B._per_call_ms(lambda i: log.append(("call", i)), 2, "cuda", 3)
    assert log[0] == ("sleep", B.HEAD_START_CYCLES) and log[1] == "record" and log[-1] == "sync"
    assert [x for x in log if isinstance(x, tuple) and x[0] == "call"] == [("call", 0), ("call", 1), ("call", 0)]
    assert times == [2.0, 2.0, 2.0]          # each pair brackets exactly its own call


def test_the_batch_separates_the_hosts_issue_time_from_the_devices(monkeypatch):
    """bench._batch_ms: the host's time to issue the calls is read before the synchronize, so a device still busy
    after the host is done (a fake 20 ms synchronize here) shows in the batch time and not in the host time."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: time.sleep(0.02))
    batch, host = B._batch_ms(lambda i: time.sleep(0.001), 1, "cuda", 4)
    assert host < 3.0 and batch > host + 3.0, (batch, host)


def test_the_model_families_run_on_the_reference(tmp_path):
    """bench_model's block (decode: the cheapest mode on the interpreter) and host cases: inputs, the check
    against the torch block, two baselines' ratios, and the JSON; the profile is GPU-only (empty here)."""
    from hk_portable.bench_model import block_case, host_case
    tiny = dict(dim=256, num_heads=2, num_kv_heads=1, ffn_dim=256)
    cases = [block_case("decode", decode_batch=2, context=32, **tiny), host_case("rms_norm")]
    report = B.run(cases, "cpu", "reference", budget_s=0.01, progress=False)
    block, host = report["results"]
    assert "error" not in block and "error" not in host, report["results"]
    assert block["rel_error"] < 1e-2 and host["rel_error"] < 1e-2
    assert block["work"] > 0 and block["context"] == 32 and block["profile"] == {}
    assert set(block["ratios_hk_over_each_baseline"]) == {"torch (cuBLAS, SDPA, F.rms_norm)"}
    assert host["unit"] == "kcall/s" and host["hk"]["rate"] > 0
    B.to_json(report, str(tmp_path / "m.json"))


def test_random_gemm_shapes_and_their_summary():
    """Issue 39's sweep: 100 fixed shapes in the issue's ranges, none a multiple of 64; the report counts those
    reaching 0.90x and lists the worst five, from the entries' own ratios."""
    shapes = B.random_gemm_shapes()
    assert len(shapes) == len(set(shapes)) == 100 and shapes == B.random_gemm_shapes()
    assert all(128 <= m <= 16384 and 128 <= n <= 16384 and 64 <= k <= 16384 and m % 64 and n % 64 and k % 64
               for m, n, k in shapes)
    assert min(k for _, _, k in shapes) < 512 and max(m for m, _, _ in shapes) > 8192     # small K and large M occur
    cases = [B.gemm_case(*g, family=B.RANDOM_GEMMS) for g in B.random_gemm_shapes(3, mn=(16, 96), k=(16, 96))]
    report = B.run(cases, "cpu", "reference", budget_s=0.01, progress=False)
    assert all("error" not in e and e["rel_error"] < 1e-2 for e in report["results"])
    ratios = sorted(e["ratio_hk_over_baseline"] for e in report["results"])
    sweep = report["random_gemms"]
    assert sweep["shapes"] == 3 and sweep["reaching"] == sum(r >= 0.9 for r in ratios)
    assert [w["ratio"] for w in sweep["worst"]] == ratios and "random GEMM shapes: " in B.table(report)
    assert not report["scaling_problems"]            # shapes of every aspect form no size sweep


def test_the_tutorial_kernel_case_checks_itself_against_eager_torch():
    """issue 42's case (the README's tunable kernel against torch.compile and eager): its check is the error against
    float64, and hk's output agrees with the eager baseline on the same inputs (torch.compile is left to the GPU run:
    its CPU build is slow and checks nothing more)."""
    import hk_portable as hk
    case = B.tunable_case(48, 40, 64)
    assert case.family == "tunable" and case.work == 2.0 * 48 * 40 * 64
    with hk.use_backend("reference"):
        bound = case.make("cpu")
        assert list(bound.baselines) == ["torch.compile", "torch eager"]
        assert bound.check() < 1e-2
        out = bound.hk(0).clone()
    eager = bound.baselines["torch eager"](0)
    assert torch.allclose(out.float(), eager.float(), atol=3e-2, rtol=3e-2)
