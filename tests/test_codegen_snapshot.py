"""benchmarks/codegen_snapshot.py --diff, the check behind issue 38's "behaviour-neutral": on hand-made snapshots."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("codegen_snapshot", ROOT / "benchmarks" / "codegen_snapshot.py")
snapshot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snapshot)


def _write(root: Path, streams: dict) -> Path:
    for key, text in streams.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text(text)
    (root / "index.json").write_text(json.dumps({k: "" for k in streams}))
    return root


def test_equal_snapshots_pass(tmp_path):
    streams = {"cuda-sm_80/k-1.s": "add r1, r2;\n", "hip-gfx942/k-1.s": "v_add_f32 v0, v1, v2\n"}
    assert snapshot.diff(_write(tmp_path / "a", streams), _write(tmp_path / "b", streams)) == 0


def test_a_changed_stream_fails(tmp_path):
    a = _write(tmp_path / "a", {"cuda-sm_80/k-1.s": "add r1, r2;\n"})
    b = _write(tmp_path / "b", {"cuda-sm_80/k-1.s": "sub r1, r2;\n"})
    assert snapshot.diff(a, b) == 1


def test_renamed_streams_pass_only_when_their_code_is_the_same(tmp_path):
    a = _write(tmp_path / "a", {"cuda-sm_80/k-1.s": "add r1, r2;\n", "cuda-sm_80/k-2.s": "mul r1, r2;\n"})
    b = _write(tmp_path / "b", {"cuda-sm_80/k-7.s": "mul r1, r2;\n", "cuda-sm_80/k-8.s": "add r1, r2;\n"})
    assert snapshot.diff(a, b) == 0
    c = _write(tmp_path / "c", {"cuda-sm_80/k-7.s": "mul r1, r2;\n", "cuda-sm_80/k-8.s": "add r1, r3;\n"})
    assert snapshot.diff(a, c) == 1
    d = _write(tmp_path / "d", {"cuda-sm_80/k-7.s": "mul r1, r2;\n"})       # a stream lost
    assert snapshot.diff(a, d) == 1
