"""How many blocks of a build fit on one SM, and how many ptxas could fit by capping registers.

ptxas caps a block's registers only for the blocks per SM that `__launch_bounds__` asks of it; by default it
gives each thread what it wants, and a block that wants many registers may leave shared memory for more blocks
unused. Where registers, not shared memory, are what limits a non-specialised block, the backend rebuilds it
asking for the blocks shared memory allows and keeps that build if it does not spill (backend._fill_sm). On
the H200 the 64x64 attention block went from 4 to 5 blocks an SM (113 -> 96 registers, no spill): +11 % at
D64 causal N1024 and N4096 (2026-12-04, benchmarks/attention_schedules.py --tile 64x64s2w4)."""
from __future__ import annotations

from .archs import Arch

REGISTER_UNIT = 256          # registers are allocated per warp in units of 256
WARP_UNIT = 4                # and warps in groups of four (one per scheduler)
RESERVED_SHARED = 1024       # shared memory the system keeps per block
PRODUCER_REGS = 24           # setmaxnreg's least: a loop, two barriers' addresses and TMA coordinates fit (no spill)
MAX_CONSUMER_REGS = 240      # below the ISA's 255 so ptxas keeps its reserved registers
# an SM's registers, warps, blocks and shared memory: the arch's row (archs.Arch)


def by_registers(registers: int, threads: int, arch: Arch) -> int:
    """Blocks per SM the registers allow."""
    per_warp = -(-max(registers, 1) * 32 // REGISTER_UNIT) * REGISTER_UNIT
    warps = arch.sm_registers // per_warp // WARP_UNIT * WARP_UNIT
    return warps // -(-threads // 32)


def by_shared(shared_bytes: int, arch: Arch) -> int:
    """Blocks per SM the shared memory allows."""
    return arch.sm_shared_bytes // (shared_bytes + RESERVED_SHARED)


def by_threads(threads: int, arch: Arch) -> int:
    return min(arch.sm_max_blocks, arch.sm_max_warps // -(-threads // 32))


def fill_target(registers: int, threads: int, shared_bytes: int, arch: Arch) -> int | None:
    """The blocks per SM to ask ptxas for (`__launch_bounds__` min blocks) when registers are what keeps a
    block below what shared memory and the thread limits allow; None when nothing is to be won (or the arch's
    SM shared memory is not planned for)."""
    if not arch.sm_shared_bytes:
        return None
    room = min(by_shared(shared_bytes, arch), by_threads(threads, arch))
    return room if room > by_registers(registers, threads, arch) else None


def register_split(warps: int, producer_warps: int, arch: Arch) -> tuple[int, int, int]:
    """(registers per thread the block compiles with, the producer's after setmaxnreg.dec, the consumers'
    after setmaxnreg.inc) for a specialised block of `warps` consumer and `producer_warps` producer warps,
    one block per SM (sharing out the arch's SM register file). The incs draw only on what the decs gave back,
    so both sums must balance against the block's own allocation (ptxas allocates the launch bounds' maximum when setmaxnreg is present)."""
    threads = 32 * (warps + producer_warps)
    block = min(255, arch.sm_registers // threads) // 8 * 8
    spare = (block - PRODUCER_REGS) * 32 * producer_warps
    consumer = min(MAX_CONSUMER_REGS, (block + spare // (32 * warps)) // 8 * 8)
    return block, PRODUCER_REGS, consumer
