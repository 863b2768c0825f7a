"""Executes a Program with torch: the executable specification of every opcode (`op_<opcode>`, one per
entry of the table in interface/opcodes.py).

All blocks of the grid run at once: every value carries a leading block dimension NB. Loops run
to the largest trip count over the blocks, with a per-block `active` flag that masks carries and
side effects, so blocks with shorter loops (causal attention) are exact too.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from ...interface import dtypes as D
from ...interface import opcodes
from ...interface.errors import ArgumentError
from ...interface.ir import GlobalType, Op, Program, Region, ScalarType, SharedBufType, TileType, Value
from ...interface.numerics import MASK32, cast_tensor, dropout_keep

_F32_OPS = {
    "exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
}


def _wrap32(x: torch.Tensor) -> torch.Tensor:
    return ((x + 2**31) & MASK32) - 2**31


class _ST:
    """A stage view of a shared buffer: buffer [NB, stages, R, C] and a per-block stage index [NB]."""
    __slots__ = ("buf", "stage")

    def __init__(self, buf, stage):
        self.buf, self.stage = buf, stage

    def read(self, nb_idx) -> torch.Tensor:
        return self.buf[nb_idx, self.stage]

    def write(self, nb_idx, value, active) -> None:
        cur = self.buf[nb_idx, self.stage]
        self.buf[nb_idx, self.stage] = torch.where(active[:, None, None], value.to(self.buf.dtype), cur)


class Interpreter:
    _rules: dict  # {opcode: op_<opcode>}: one rule per opcode of the table, checked when a class is defined

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls._rules = opcodes.rules(cls, who=f"interpreter {cls.__name__}")

    def __init__(self, program: Program, args: Sequence[Any], grid: tuple[int, int, int]):
        self.p = program
        self.grid = grid
        self.nb = grid[0] * grid[1] * grid[2]
        self.env: dict[Value, Any] = {}
        self.device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        self.bidx = torch.arange(self.nb, device=self.device)
        for prm, v, a in zip(program.params, program.body.args, args):
            if isinstance(prm.type, GlobalType):
                self.env[v] = a
            else:
                dt = torch.int64 if prm.type.dtype is D.i32 else torch.float32
                self.env[v] = torch.full((self.nb,), a, dtype=dt, device=self.device)

    def run(self) -> None:
        active = torch.ones(self.nb, dtype=torch.bool, device=self.device)
        self.region(self.p.body, active)

    # ------------------------------------------------------------------------------------ regions
    def region(self, reg: Region, active) -> None:
        for op in reg.ops:
            out = self._rules[op.opcode](self, op, active)
            if op.results:
                if len(op.results) == 1 and not isinstance(out, tuple):
                    out = (out,)
                for r, val in zip(op.results, out):
                    self.env[r] = val

    def _loop(self, trips, active, init, body):
        carry = list(init)
        n_max = int(trips.max().item()) if trips.numel() else 0
        for it in range(max(n_max, 0)):
            act = active & (it < trips)
            if not bool(act.any()):
                break
            new = body(it, act, carry)
            carry = [self._select(act, n, c) for n, c in zip(new, carry)]
        return tuple(carry)

    @staticmethod
    def _select(active, new, old):
        shape = (-1,) + (1,) * (new.dim() - 1)
        return torch.where(active.view(shape), new.to(old.dtype), old)

    def op_for(self, op: Op, active):
        lo, hi = self.env[op.operands[0]], self.env[op.operands[1]]
        init = [self.env[v] for v in op.operands[2:]]
        (reg,) = op.regions

        def body(it, act, carry):
            self.env[reg.args[0]] = lo + it
            for a, c in zip(reg.args[1:], carry):
                self.env[a] = c
            self.region(reg, act)
            return [self.env[y] for y in reg.yields]

        return self._loop((hi - lo).clamp(min=0), active, init, body)

    def op_pipeline(self, op: Op, active):
        n = self.env[op.operands[0]]
        init = [self.env[v] for v in op.operands[1:]]
        lreg, creg = op.regions
        stages = op.attrs["stages"]

        def body(it, act, carry):
            i = torch.full((self.nb,), it, dtype=torch.int64, device=self.device)
            s = i % stages
            self.env[lreg.args[0]], self.env[lreg.args[1]] = i, s
            self.region(lreg, act)
            self.env[creg.args[0]], self.env[creg.args[1]] = i, s
            for a, c in zip(creg.args[2:], carry):
                self.env[a] = c
            self.region(creg, act)
            return [self.env[y] for y in creg.yields]

        return self._loop(n.clamp(min=0), active, init, body)

    # ------------------------------------------------------------------------------------ scalars
    def op_scalar_const(self, op, active):
        t = op.result.type
        dt = torch.int64 if t.dtype is D.i32 else torch.float32
        return torch.full((self.nb,), op.attrs["value"], dtype=dt, device=self.device)

    def op_block_idx(self, op, active):
        gx, gy, _ = self.grid
        a = op.attrs["axis"]
        return [self.bidx % gx, (self.bidx // gx) % gy, self.bidx // (gx * gy)][a]

    def op_num_blocks(self, op, active):
        return torch.full((self.nb,), self.grid[op.attrs["axis"]], dtype=torch.int64, device=self.device)

    def op_global_dim(self, op, active):
        t = self.env[op.operands[0]]
        return torch.full((self.nb,), t.shape[op.attrs["index"]], dtype=torch.int64, device=self.device)

    def op_scalar_binary(self, op, active):
        a, b = (self.env[v] for v in op.operands)
        k = op.attrs["op"]
        if k in ("floordiv", "mod"):
            if bool(((b == 0) & active).any()):
                raise ZeroDivisionError(f"integer {k} by zero in kernel '{self.p.name}'")
            b = torch.where(b == 0, torch.ones_like(b), b)
        r = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "floordiv": torch.floor_divide,
             "mod": torch.remainder, "min": torch.minimum, "max": torch.maximum, "div": torch.div}[k](a, b)
        return _wrap32(r) if op.result.type.dtype is D.i32 else r.float()

    def op_scalar_cast(self, op, active):
        x = self.env[op.operands[0]]
        if op.attrs["dtype"] == "f32":
            return x.float()
        return cast_tensor(x, torch.int32).long()

    # ------------------------------------------------------------------------------------ memory
    def op_alloc_shared(self, op, active):
        t: SharedBufType = op.result.type
        # poison: reading shared memory nothing wrote gives NaN (or a large int), never a plausible value
        fill = float("nan") if t.dtype.is_float else -12345
        return torch.full((self.nb, t.stages) + t.shape, fill, dtype=t.dtype.torch, device=self.device)

    def op_shared_stage(self, op, active):
        return _ST(self.env[op.operands[0]], self.env[op.operands[1]] % op.operands[0].type.stages)

    def _gather_index(self, gl: torch.Tensor, idx: list, tile_shape: tuple):
        """Per-block element coordinates of a tile and the in-bounds mask (both [NB, *tile_shape])."""
        nd, rank = len(tile_shape), gl.dim()
        lead = [self.env[v] for v in idx[: rank - nd]]
        tile_ix = [self.env[v] for v in idx[rank - nd:]]
        view = (self.nb,) + (1,) * nd
        coords, valid = [], torch.ones((self.nb,) + tile_shape, dtype=torch.bool, device=self.device)
        for d, x in enumerate(lead):
            ok = (x >= 0) & (x < gl.shape[d])
            valid = valid & ok.view(view)
            coords.append(x.clamp(0, max(gl.shape[d] - 1, 0)).view(view))
        for k, (x, n) in enumerate(zip(tile_ix, tile_shape)):
            d = rank - nd + k
            shape = [1] * nd
            shape[k] = n
            e = (x * n).view(view) + torch.arange(n, device=self.device).view(1, *shape)
            ok = (e >= 0) & (e < gl.shape[d])
            valid = valid & ok
            coords.append(e.clamp(0, max(gl.shape[d] - 1, 0)))
        return coords, valid

    def _read_gl(self, gl, idx, tile_shape, fill, dtype):
        coords, valid = self._gather_index(gl, idx, tile_shape)
        if gl.numel() == 0:
            vals = torch.zeros(valid.shape, dtype=gl.dtype, device=self.device)
        else:
            vals = gl[tuple(c.expand(valid.shape) for c in coords)]
        vals = cast_tensor(vals, dtype) if vals.dtype != dtype else vals
        return torch.where(valid, vals, torch.tensor(fill, device=self.device).to(dtype))

    def op_global_to_register(self, op, active):
        t: TileType = op.result.type
        gl = self.env[op.operands[0]]
        return self._read_gl(gl, op.operands[1:], t.shape, op.attrs["fill"], t.dtype.torch)

    def op_global_to_scalar(self, op, active):
        gl = self.env[op.operands[0]]
        idx = [self.env[v] for v in op.operands[1:]]
        valid = torch.ones(self.nb, dtype=torch.bool, device=self.device)
        for d, x in enumerate(idx):
            valid = valid & (x >= 0) & (x < gl.shape[d])
        fill = torch.full((self.nb,), op.attrs["fill"], dtype=torch.int64, device=self.device)
        if gl.numel() == 0:
            return fill
        vals = gl[tuple(x.clamp(0, max(gl.shape[d] - 1, 0)) for d, x in enumerate(idx))].long()
        return torch.where(valid, vals, fill)

    def op_global_to_shared(self, op, active):
        st: _ST = self.env[op.operands[0]]
        gl = self.env[op.operands[1]]
        shape = tuple(st.buf.shape[2:])
        st.write(self.bidx, self._read_gl(gl, op.operands[2:], shape, op.attrs["fill"], gl.dtype), active)

    def _write_gl(self, op, active, accumulate: bool):
        gl, src = self.env[op.operands[0]], op.operands[1]
        val = self._tile_value(src)
        coords, valid = self._gather_index(gl, op.operands[2:], tuple(val.shape[1:]))
        valid = valid & active.view((-1,) + (1,) * (val.dim() - 1))
        sel = tuple(c.expand(valid.shape)[valid] for c in coords)
        v = cast_tensor(val, gl.dtype)[valid]
        if accumulate:
            gl.index_put_(sel, v, accumulate=True)
        else:
            gl[sel] = v

    def op_register_to_global(self, op, active):
        self._write_gl(op, active, accumulate=False)

    def op_shared_to_global(self, op, active):
        self._write_gl(op, active, accumulate=False)

    def op_atomic_add(self, op, active):
        self._write_gl(op, active, accumulate=True)

    def _tile_value(self, v: Value) -> torch.Tensor:
        x = self.env[v]
        return x.read(self.bidx) if isinstance(x, _ST) else x

    def op_shared_to_register(self, op, active):
        return self._tile_value(op.operands[0]).clone()

    def op_register_to_shared(self, op, active):
        self.env[op.operands[0]].write(self.bidx, self.env[op.operands[1]], active)

    # ------------------------------------------------------------------------------------ compute
    def op_fill(self, op, active):
        t: TileType = op.result.type
        return torch.full((self.nb,) + t.shape, op.attrs["value"], dtype=torch.float64,
                          device=self.device).to(t.dtype.torch) if t.dtype.is_float else \
            torch.full((self.nb,) + t.shape, op.attrs["value"], dtype=t.dtype.torch, device=self.device)

    def op_splat(self, op, active):
        t: TileType = op.result.type
        s = self.env[op.operands[0]]
        s = cast_tensor(s.float() if t.dtype.is_float else s, t.dtype.torch)
        return s.view((-1,) + (1,) * len(t.shape)).expand((self.nb,) + t.shape).clone()

    def op_broadcast(self, op, active):
        v = self.env[op.operands[0]]
        t: TileType = op.result.type
        return (v[:, :, None] if op.attrs["axis"] == "row" else v[:, None, :]).expand((self.nb,) + t.shape).clone()

    @staticmethod
    def _compute_dtype(dt: torch.dtype) -> torch.dtype:
        return torch.float32 if dt.is_floating_point else torch.int64

    def op_unary(self, op, active):
        x = self.env[op.operands[0]]
        k, out_dt = op.attrs["op"], x.dtype
        if k == "not":
            return ~x
        xc = x.to(self._compute_dtype(out_dt))
        if k == "neg":
            r = -xc
        elif k == "abs":
            r = xc.abs()
        elif k == "relu":
            r = torch.clamp_min(xc, 0)
        else:
            r = _F32_OPS[k](xc)
        return _wrap32(r).to(out_dt) if not out_dt.is_floating_point else cast_tensor(r, out_dt)

    def op_binary(self, op, active):
        a, b = (self.env[v] for v in op.operands)
        k, out_dt = op.attrs["op"], a.dtype
        if k == "and":
            return a & b
        if k == "or":
            return a | b
        cd = self._compute_dtype(out_dt)
        a, b = a.to(cd), b.to(cd)
        r = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
             "maximum": torch.fmax, "minimum": torch.fmin}[k](a, b)
        return _wrap32(r).to(out_dt) if not out_dt.is_floating_point else cast_tensor(r, out_dt)

    def op_compare(self, op, active):
        a, b = (self.env[v] for v in op.operands)
        return {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq,
                "ne": torch.ne}[op.attrs["op"]](a, b)

    def op_where(self, op, active):
        m, a, b = (self.env[v] for v in op.operands)
        return torch.where(m, a, b)

    def op_cast(self, op, active):
        x = self.env[op.operands[0]]
        return cast_tensor(x, op.result.type.dtype.torch)

    def op_reduce(self, op, active):
        x = self.env[op.operands[0]]
        dim = 2 if op.attrs["axis"] == "row" else 1
        k = op.attrs["op"]
        if k == "sum":
            acc = torch.float64 if x.is_floating_point() else torch.int64
            r = x.to(acc).sum(dim)
            return _wrap32(r).to(x.dtype) if not x.is_floating_point() else cast_tensor(r, x.dtype)
        if x.is_floating_point():
            # NaN-ignoring like the fmax/fmin elementwise ops (maxNum semantics)
            fillv = float("-inf") if k == "max" else float("inf")
            xn = torch.where(torch.isnan(x), torch.tensor(fillv, dtype=x.dtype, device=x.device), x)
            r = xn.amax(dim) if k == "max" else xn.amin(dim)
            all_nan = torch.isnan(x).all(dim)
            return torch.where(all_nan, torch.tensor(float("nan"), dtype=x.dtype, device=x.device), r)
        return x.amax(dim) if k == "max" else x.amin(dim)

    def op_mma(self, op, active):
        a, b, acc = (self._tile_value(v) for v in op.operands)
        a, b = a.double(), b.double()
        if op.attrs["trans_a"]:
            a = a.transpose(1, 2)
        if op.attrs["trans_b"]:
            b = b.transpose(1, 2)
        return (acc.double() + torch.bmm(a, b)).float()

    # -------------------------------------------------------------------------------------- masks
    def _rows_cols(self, op, row_off, col_off):
        R, C = op.result.type.shape
        r = self.env[row_off].view(-1, 1, 1) + torch.arange(R, device=self.device).view(1, R, 1)
        c = self.env[col_off].view(-1, 1, 1) + torch.arange(C, device=self.device).view(1, 1, C)
        return r, c

    def op_causal_mask(self, op, active):
        r, c = self._rows_cols(op, *op.operands[:2])
        return (r >= c).expand((self.nb,) + op.result.type.shape).clone()

    def op_bounds_mask(self, op, active):
        r, c = self._rows_cols(op, *op.operands[:2])
        nr, nc = (self.env[v].view(-1, 1, 1) for v in op.operands[2:])
        return ((r >= 0) & (r < nr) & (c >= 0) & (c < nc)).expand((self.nb,) + op.result.type.shape).clone()

    def op_dropout_mask(self, op, active):
        p, seed_lo, seed_hi, off_lo, off_hi, row_off, col_off, row_stride = op.operands
        r, c = self._rows_cols(op, row_off, col_off)
        u32 = lambda v: self.env[v] & MASK32  # noqa: E731
        offset = u32(off_lo) | (u32(off_hi) << 32)
        stride = self.env[row_stride]
        g = offset.view(-1, 1, 1) + r * stride.view(-1, 1, 1) + c
        seed_vals = (u32(seed_lo) | (u32(seed_hi) << 32))
        pv = self.env[p]
        if not (bool((seed_vals == seed_vals[0]).all()) and bool((pv == pv[0]).all())):
            raise ArgumentError("dropout_mask: seed and p must be the same for every block")
        return dropout_keep(float(pv[0]), int(seed_vals[0]) & (2**64 - 1), g)


Interpreter._rules = opcodes.rules(Interpreter, who="the reference interpreter")
