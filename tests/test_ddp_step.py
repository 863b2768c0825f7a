"""benchmarks/ddp_step.py on two CPU processes (torchrun, gloo): DDP over hk ops matches one process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# ~30 s on a busy 2-core runner (two processes import torch and run the reference); the only test of the DDP script,
# so not `slow` (which the default run leaves out)
def test_ddp_step_script_passes_on_two_cpu_ranks(tmp_path):
    out = tmp_path / "ddp.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                          str(ROOT / "benchmarks/ddp_step.py"), "--device", "cpu", "--steps", "3", "--batch", "4",
                          "--seq", "16", "--json", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["pass"] and result["world_size"] == 2 and result["ranks_identical"]
    assert len(result["losses_ddp"]) == len(result["losses_single"]) == 3
    assert 0 < result["hk_share"] <= 1
