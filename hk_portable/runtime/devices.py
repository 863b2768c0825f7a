"""What a library wrapper may ask of the device its tensors are on, without naming a part: how many compute units
(NVIDIA SMs, AMD CUs) run blocks side by side, to size a grid (attention_kvcache's KV splits). Read from torch once
per device; kernels/ holds no device numbers (tests/test_architecture.py)."""
from __future__ import annotations

import torch

# A CPU tensor runs on the reference or an emulated target: its work is split as on a 132-unit GPU (an H100/H200),
# so a CPU run takes the paths (split counts, combine kernels) a GPU run takes.
MODELLED_UNITS = 132

_UNITS: dict = {}


def compute_units(device: torch.device) -> int:
    """The compute units of `device` (torch's multi_processor_count: SMs on CUDA, CUs on ROCm); MODELLED_UNITS for
    a device torch reports none for (the CPU)."""
    key = (device.type, device.index)
    units = _UNITS.get(key)
    if units is None:
        units = MODELLED_UNITS
        if device.type == "cuda":
            index = torch.cuda.current_device() if device.index is None else device.index
            units = int(torch.cuda.get_device_properties(index).multi_processor_count)
        _UNITS[key] = units
    return units
