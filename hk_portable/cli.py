"""The `hk` command: list backends, run the conformance suite, show what a backend compiles.

    hk backends [--json]
    hk conformance --backend SPEC [--target T] [--emulate] [--json FILE] [-k PATTERN] [--seed N]
    hk compile KERNEL --backend SPEC [--target T] --emit ir|source|asm|ptx|sass|hsaco [-o FILE] [--arg N=V]
    hk analyze KERNEL --backend SPEC [--target T] [--arg N=V] [--json]
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

# nothing here imports torch (hk_portable.interface does): `hk --help` answers at once; each command imports what it
# runs
from .emit_kinds import EMIT_KINDS
from .version import __version__

EXIT_FAILED, EXIT_ERROR = 1, 2
ARG_HELP = "an argument of the kernel module's example_args (e.g. D=128), repeatable"
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
    console = Console()
    console.print(table)
    from .runtime import clauncher
    console.print(f"GPU launches: {clauncher.describe()}", highlight=False, markup=False)
    from .runtime import opfast
    console.print(f"op calls: {opfast.describe()}", highlight=False, markup=False)
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
    from .interface.errors import UnsupportedError
    from .codegen.lowering import parse_emit
    emit, after = parse_emit(args.emit)
    backend, target, program, artifact = _compile(args, lower=emit not in ("ir", "lowered"))
    out: str | bytes
    if emit == "ir":                # the Program every backend receives, no compiling needed
        out = str(program)
    elif emit == "lowered":         # the Program with the backend's lowering passes' annotations for the target
        out = backend.lowered(program, target, after)
    else:
        out = backend.emit(artifact, args.emit)
        if not isinstance(out, (str, bytes)):
            raise UnsupportedError(f"backend {backend.name!r} emitted {type(out).__name__} for {args.emit!r}")
    _write(out, args.output, args.emit)
    return 0


def _emit_kind(kind: str) -> str:
    """argparse's check of --emit: one of EMIT_KINDS, or lowered:after=PASS."""
    if kind not in EMIT_KINDS and not kind.startswith("lowered:after="):
        raise argparse.ArgumentTypeError(f"invalid choice: {kind!r} (choose from {', '.join(EMIT_KINDS)}, "
                                         "lowered:after=PASS)")
    return kind


def _compile(args, lower: bool = True):
    """(backend, target, Program, Artifact or None) for `hk compile` and `hk analyze`: KERNEL traced with its
    module's example_args (overridden by --arg NAME=VALUE) at the configuration a call on the target would
    choose and, if `lower`, compiled for the target."""
    from . import kernels
    from .runtime import compile_program
    name, arch, emulate = _spec(args)
    backend = _load_backend(name)
    target = backend.target(arch, emulated=emulate or None)
    try:
        module, kernel = _user_kernel(args.kernel) if ":" in args.kernel else kernels.load(args.kernel)
    except LookupError as e:
        raise CliError(str(e)) from None
    overrides = _example_overrides(args.arg or [])
    attr = args.kernel.rpartition(":")[2]
    make_args = getattr(module, f"example_args_{attr}", None) or module.example_args   # one per kernel, or shared
    try:
        example_args, consts = make_args(device="cpu", **overrides)
    except TypeError as e:
        raise CliError(f"--arg: {args.kernel}'s example_args does not take {overrides}: {e}") from None
    except (ValueError, RuntimeError, ArithmeticError) as e:    # e.g. a negative size torch refuses
        raise CliError(f"--arg {' '.join(f'{k}={v!r}' for k, v in overrides.items())}: {args.kernel}'s example "
                       f"arguments cannot be made from it: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                       ) from None
    if callable(getattr(module, "candidates", None)):     # what a call would run on this target
        consts = kernel.choose_config(module.candidates(consts, example_args), *example_args, backend=target.spec)
    elif kernel.tunables is not None:                     # the tunables example_args leaves out: this target's choice
        consts = kernel.configure(*example_args, backend=target.spec, **consts)
    program = kernel.trace(*example_args, **consts)
    return backend, target, program, compile_program(program, backend, target) if lower else None


def _example_overrides(pairs: list[str]) -> dict:
    """--arg NAME=VALUE pairs as keyword arguments of example_args (VALUE a Python literal, else a string)."""
    import ast
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise CliError(f"--arg {pair!r}: expected NAME=VALUE, e.g. --arg D=128")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


# ------------------------------------------------------------------------------------------- analyze
def cmd_analyze(args) -> int:
    backend, _, _, artifact = _compile(args)
    report = backend.analyze(artifact)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print_analysis(report)
    return 0


def _print_analysis(report: dict) -> None:
    """The analysis as tables: resources and occupancy, then the loops (main loop first), one column per
    loop and view (a loop's dict-valued entries, e.g. all paths and one trip), one row per figure."""
    print(f"hk analyze: {report['kernel']} on {report['target']}; main loop: {report.get('main_loop') or 'none'}")
    _table("resource use", ["what", "value"],
           [[k, v] for part in ("resources", "occupancy") for k, v in report.get(part, {}).items()])
    loops = sorted(report["loops"], key=lambda lp: not lp.get("main"))
    shown = [lp for lp in loops if lp.get("main")] or loops[:1]
    if len(shown) < len(loops):
        print(f"({len(loops) - len(shown)} other loops: see --json)")
    columns = []                                 # (heading, flattened figures)
    for lp in shown:
        scalars = {k: v for k, v in lp.items() if not isinstance(v, dict) and k not in ("header", "main")}
        for view, figures in ((k, v) for k, v in lp.items() if isinstance(v, dict)):
            columns.append((f"{'* ' if lp.get('main') else ''}{lp['header']} {view}", {**_flatten(scalars),
                                                                                         **_flatten(figures)}))
    if columns:
        keys = [k for k in dict.fromkeys(k for _, figures in columns for k in figures)
                if any(figures.get(k) not in (0, None, "") for _, figures in columns)]      # zero rows left out
        _table("the main loop, per iteration (figures that are zero left out)", ["figure"] + [h for h, _ in columns],
               [[k] + [figures.get(k, "") for _, figures in columns] for k in keys])
    for lp in shown:
        for view, c in ((v, lp[v].get("clocks", {})) for v in ("one_trip", "all_paths") if isinstance(lp.get(v), dict)):
            if "bound_vs_peak" in c:
                print(f"{lp['header']} {view}: bound {c['bound']} against the MFMA instructions chosen, "
                      f"{c['bound_vs_peak']} against {report['target']}'s matrix peak (bound_vs_peak; the forms used "
                      f"reach {c['form_efficiency']} of the peak)")
    for line in report.get("assumptions", []):
        print(f"  - {line}")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = ", ".join(map(str, v)) if isinstance(v, list) else v
    return out


def _table(title: str, heads: list[str], rows: list[list]) -> None:
    """A rich table when rich is installed, else aligned plain text."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(r[i])) for r in [heads] + rows) for i in range(len(heads))]
        print(title)
        for r in [heads] + rows:
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
        return
    table = Table(title=title)
    for h in heads:
        table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(*(str(c) for c in r))
    Console().print(table)


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
    if not callable(getattr(module, f"example_args_{attr}", None) or getattr(module, "example_args", None)):
        raise LookupError(f"{spec}: {where} must define example_args_{attr}(device='cpu') or, shared by its "
                          "kernels, example_args(device='cpu') -> (args, consts): the arguments the kernel is "
                          "compiled for")
    return module, kernel


def _write(out: str | bytes, path: str | None, kind: str) -> None:
    if path:
        mode = "wb" if isinstance(out, bytes) else "w"
        try:
            with open(path, mode) as f:
                f.write(out)
        except OSError as e:
            raise CliError(f"-o {path}: {e.strerror or e}") from None
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
    k.add_argument("--emit", required=True, type=_emit_kind, metavar="|".join(EMIT_KINDS),
                   help="what to show; lowered:after=PASS shows the lowering after that pass")
    k.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout (needed for binaries)")
    k.add_argument("--arg", action="append", metavar="NAME=VALUE", help=ARG_HELP)
    k.set_defaults(func=cmd_compile)

    a = sub.add_parser("analyze", help="what bounds a kernel's speed, read from its machine code: loops, "
                       "instruction classes, occupancy, the issue-rate bound against the MFMAs chosen and "
                       "against the arch's matrix peak (hip)")
    a.add_argument("kernel", metavar="KERNEL", help="a library kernel or MODULE:KERNEL, as for hk compile")
    a.add_argument("--backend", required=True, metavar="SPEC", help=SPEC_HELP)
    a.add_argument("--target", metavar="ARCH", help="target arch (default: the backend's default target)")
    a.add_argument("--arg", action="append", metavar="NAME=VALUE", help=ARG_HELP)
    a.add_argument("--json", action="store_true", help="print the analysis as JSON")
    a.set_defaults(func=cmd_analyze)

    m = sub.add_parser("bench", help="library kernels against vendor baselines, side by side, self-checking")
    m.add_argument("--backend", default=None, help="backend spec (default: chosen by the tensors' device)")
    m.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="where inputs live (default: cuda when torch sees a GPU, else cpu at small sizes)")
    m.add_argument("--quick", action="store_true", help="two GEMM shapes and the N=4096 D=128 attention cases")
    m.add_argument("-k", dest="pattern", default=None, help="only cases whose name contains this substring")
    m.add_argument("--budget", type=float, default=1.0, help="seconds of timing per function (default 1)")
    m.add_argument("--json", default=None, help="write the report here")
    m.add_argument("--plot", default=None, help="write one PNG per family: PREFIX-FAMILY.png")
    m.set_defaults(func=cmd_bench)
    return p


def cmd_bench(args) -> int:
    from . import bench
    return bench.main(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .interface.errors import HKError
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
