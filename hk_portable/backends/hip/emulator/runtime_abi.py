"""The Python side of the runtime ABI: its version, the modeled archs, and ctypes mirrors of the records
declared in hk_emu_common.h. A change here is a change there (and bumps ABI)."""
from __future__ import annotations

import ctypes

ABI = 5
PAGE = 4096

# The archs the emulator models (it imports nothing outside its package: a model of its own, held equal to the
# hip backend's table, backends/hip/archs.py, by tests/emulator/test_modules.py).
# arch -> (numeric id the runtime uses, LDS bytes per workgroup)
ARCHS = {"gfx942": (942, 64 * 1024), "gfx950": (950, 160 * 1024)}
LDS_DMA_WIDE = frozenset({"gfx950"})     # LDS-DMA of 12 or 16 bytes a lane

# hk_emu_param.kind -> the kind Param reports
PARAM_KINDS = {0: "other", 1: "int", 2: "uint", 3: "float", 4: "pointer", 5: "bool"}


class CParam(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("align", ctypes.c_uint32), ("kind", ctypes.c_uint32)]


class CModInfo(ctypes.Structure):
    _fields_ = [("abi", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("lds_lo", ctypes.c_void_p),
                ("lds_hi", ctypes.c_void_p), ("dyn", ctypes.c_void_p), ("dyn_cap", ctypes.c_uint64),
                ("guard_lo", ctypes.c_void_p), ("guard_hi", ctypes.c_void_p)]


class CRegion(ctypes.Structure):
    _fields_ = [("lo", ctypes.c_uint64), ("hi", ctypes.c_uint64), ("map_lo", ctypes.c_uint64),
                ("map_hi", ctypes.c_uint64), ("name", ctypes.c_char_p)]


class CLaunch(ctypes.Structure):
    _fields_ = [("abi", ctypes.c_uint32), ("nworkers", ctypes.c_uint32), ("entries", ctypes.c_void_p),
                ("mods", ctypes.c_void_p), ("params", ctypes.c_void_p), ("grid", ctypes.c_uint32 * 3),
                ("block", ctypes.c_uint32 * 3), ("dyn_lds", ctypes.c_uint32), ("arch", ctypes.c_uint32),
                ("lds_limit", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("kernel", ctypes.c_char_p),
                ("regions", ctypes.c_void_p), ("nregions", ctypes.c_uint32), ("timeout_ms", ctypes.c_uint32),
                ("err", ctypes.c_void_p), ("errcap", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("stats", ctypes.c_uint64 * 8)]
