"""The `hk` command: list backends, run the conformance suite, show what a backend compiles.

    hk backends [--json]
    hk conformance --backend SPEC [--target T] [--emulate] [--json FILE] [-k PATTERN] [--seed N]
    hk compile KERNEL --backend SPEC [--target T] --emit ir|source|asm|ptx|sass|hsaco [-o FILE]
    hk --version

SPEC names a backend as everywhere else: NAME, NAME:ARCH or NAME:ARCH:emulated (hip:gfx950:emulated);
--target ARCH and --emulate say the same in two flags.

Errors are one line on stderr and exit status 2; `hk conformance` exits 1 when a case failed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

from . import __version__
from .interface.backend import EMIT_KINDS
from .interface.errors import HKError

EXIT_FAILED, EXIT_ERROR = 1, 2
SPEC_HELP = "NAME, NAME:ARCH or NAME:ARCH:emulated (e.g. reference, cuda:sm_80, hip:gfx950:emulated)"


class CliError(Exception):
    """A user-facing error: printed as one line, no traceback."""


# ------------------------------------------------------------------------------------------ backends
def cmd_backends(args) -> int:
    from .runtime import registry
    infos = registry.report()
    if args.json:
        print(json.dumps([i.to_json() for i in infos], indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table
    table = Table(title="hk_portable backends (entry-point group hk_portable.backends)")
    for col in ("name", "loaded", "usable here", "reason / device", "targets"):
        table.add_column(col, overflow="fold")
    for i in infos:
        table.add_row(i.name, "yes" if i.loaded else "[red]no[/]", "[green]yes[/]" if i.available else "[yellow]no[/]",
                      i.reason or i.device or "", ", ".join(i.targets))
    Console().print(table)
    return 0


# --------------------------------------------------------------------------------------- conformance
def cmd_conformance(args) -> int:
    from rich.console import Console

    from .conformance import report
    from .conformance.cases import all_cases
    from .conformance.runner import FAILED, Session, select_cases
    if "OMP_NUM_THREADS" not in os.environ:
        # the cases are small tensors: one thread is as fast, and immune to CPU contention (measured:
        # two spinning threads on a busy 2-core runner made the suite 15x slower)
        import torch
        torch.set_num_threads(1)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    name, arch, emulate = _spec(args)
    session = Session(_load_backend(name), arch, emulate, seed)
    cases = select_cases(all_cases(), args.k)
    if not cases:
        raise CliError(f"no conformance case matches -k {' '.join(args.k)!r}")
    console = Console()
    if not console.is_terminal:            # logs: wide enough that case ids and reasons stay on one line
        console = Console(width=160)
    console.print(f"hk conformance: {len(cases)} cases on backend {session.backend.name}, target "
                  f"{session.target.arch}{' (emulated)' if session.target.emulated else ''}, seed {seed}")
    result = session.run(cases, on_result=_progress(console, len(cases)))
    report.certificate(result, console, only_problems=args.problems_only)
    if args.json:
        report.write_json(result, args.json)
        console.print(f"report written to {args.json}")
    return EXIT_FAILED if result.summary[FAILED] else 0


def _progress(console, total: int):
    """A one-line progress report on a terminal (nothing when output is redirected)."""
    if not console.is_terminal:
        return None
    done = [0]

    def on_result(r):
        done[0] += 1
        console.print(f"  {done[0]}/{total} {r.id}", end="\r", highlight=False, soft_wrap=True)
    return on_result


# ------------------------------------------------------------------------------------------- compile
def cmd_compile(args) -> int:
    from . import kernels
    from .interface.errors import UnsupportedError
    from .runtime import compile_program
    name, arch, emulate = _spec(args)
    backend = _load_backend(name)
    target = backend.target(arch, emulated=emulate or None)
    try:
        module, kernel = _user_kernel(args.kernel) if ":" in args.kernel else kernels.load(args.kernel)
    except LookupError as e:
        raise CliError(str(e)) from None
    example_args, consts = module.example_args(device="cpu")
    if callable(getattr(module, "candidates", None)):     # what a call would run on this target
        consts = kernel.choose_config(module.candidates(consts), *example_args, backend=target.spec)
    program = kernel.trace(*example_args, **consts)
    out: str | bytes
    if args.emit == "lowered":       # the Program with the backend's schedule decisions
        out = backend.lowered(program, target)
    elif args.emit == "ir":          # the Program every backend receives: no compiling needed
        out = str(program)
    else:
        artifact = compile_program(program, backend, target)
        out = backend.emit(artifact, args.emit)
        if not isinstance(out, (str, bytes)):
            raise UnsupportedError(f"backend {backend.name!r} emitted {type(out).__name__} for {args.emit!r}")
    _write(out, args.output, args.emit)
    return 0


def _user_kernel(spec: str):
    """(module, kernel) for MODULE:KERNEL, MODULE a dotted module or a .py file that defines the kernel and
    `example_args(device="cpu") -> (args, consts)`, as the library's kernel modules do."""
    import importlib
    import importlib.util
    from .runtime.launch import Kernel
    where, _, attr = spec.rpartition(":")
    try:
        if where.endswith(".py"):
            loader_spec = importlib.util.spec_from_file_location(f"hk_user_{abs(hash(where))}", where)
            if loader_spec is None:
                raise LookupError(f"{where}: not a Python file")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except (ImportError, OSError) as e:
        raise LookupError(f"{spec}: cannot import {where!r}: {e}") from None
    kernel = getattr(module, attr, None)
    if not isinstance(kernel, Kernel):
        raise LookupError(f"{spec}: {where} has no hk.kernel named {attr!r}")
    if not callable(getattr(module, "example_args", None)):
        raise LookupError(f"{spec}: {where} must define example_args(device='cpu') -> (args, consts), the "
                          "arguments the kernel is compiled for")
    return module, kernel


def _write(out: str | bytes, path: str | None, kind: str) -> None:
    if path:
        mode = "wb" if isinstance(out, bytes) else "w"
        with open(path, mode) as f:
            f.write(out)
        print(f"wrote {kind} ({len(out)} {'bytes' if isinstance(out, bytes) else 'characters'}) to {path}",
              file=sys.stderr)
    elif isinstance(out, bytes):
        raise CliError(f"--emit {kind} is binary; write it to a file with -o FILE")
    else:
        sys.stdout.write(out if out.endswith("\n") else out + "\n")


# ------------------------------------------------------------------------------------------- helpers
def _spec(args) -> tuple[str, str | None, bool]:
    """(name, arch or None, emulated) from --backend SPEC with --target and --emulate, which must agree."""
    from .runtime import selection
    return selection.with_flags(args.backend, args.target, getattr(args, "emulate", False))


def _load_backend(name: str):
    """The named backend, loaded (BackendError names the installed ones, or why it failed)."""
    from .runtime import registry
    return registry.load(name)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hk", description="hk_portable: tile kernels written once, run on AMD, "
                                "NVIDIA and the CPU reference.")
    p.add_argument("--version", action="version", version=f"hk_portable {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("backends", help="list installed backends: loaded?, usable here?, why not, targets")
    b.add_argument("--json", action="store_true", help="print JSON: [{name, available, reason, targets, ...}]")
    b.set_defaults(func=cmd_backends)

    c = sub.add_parser("conformance", help="run the conformance suite and print its certificate")
    c.add_argument("--backend", required=True, metavar="SPEC", help=SPEC_HELP)
    c.add_argument("--target", metavar="ARCH", help="target arch (default: the backend's default target)")
    c.add_argument("--emulate", action="store_true", help="run on the backend's emulated target (arch --target)")
    c.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    c.add_argument("-k", action="append", metavar="PATTERN",
                   help="only cases whose id contains PATTERN (or matches it as a glob: *, ?); comma-separated "
                        "alternatives; '!PATTERN' excludes; may be repeated")
    c.add_argument("--seed", type=int, help="seed of the inputs (default: fresh, printed in the report)")
    c.add_argument("--problems-only", action="store_true", help="list only failed and skipped cases")
    c.set_defaults(func=cmd_conformance)

    k = sub.add_parser("compile", help="show what a backend makes of a library kernel (example configuration)")
    k.add_argument("kernel", metavar="KERNEL", help="a library kernel (gemm, attention_fwd, attention_bwd, "
                   "dropout_residual_layernorm, rotary) or MODULE:KERNEL for your own (a dotted module or a .py "
                   "file that defines example_args)")
    k.add_argument("--backend", required=True, metavar="SPEC", help=SPEC_HELP)
    k.add_argument("--target", metavar="ARCH", help="target arch (default: the backend's default target)")
    k.add_argument("--emit", required=True, choices=EMIT_KINDS)
    k.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout (needed for binaries)")
    k.set_defaults(func=cmd_compile)

    from . import bench
    m = sub.add_parser("bench", help="library kernels against vendor baselines, side by side, self-checking")
    bench.add_arguments(m)
    m.set_defaults(func=bench.main)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (HKError, CliError) as e:
        print(f"hk {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("hk: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
