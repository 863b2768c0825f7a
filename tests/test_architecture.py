"""The import graph of hk_portable, read from the source with `ast` (imports inside functions count too):
the interface imports nothing above it, no backend imports another, kernels import only the interface."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import hk_portable
from hk_portable.interface.opcodes import OPCODES

ROOT = Path(hk_portable.__file__).resolve().parent
PACKAGE = "hk_portable"


def _module_name(path: Path) -> str:
    parts = (PACKAGE,) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, absolute; `from M import n` counts as M and as M.n (n may be a module)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


MODULES = {_module_name(p): _imports(p) for p in sorted(ROOT.rglob("*.py"))}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _modules_under(prefix: str) -> dict[str, set[str]]:
    return {m: imps for m, imps in MODULES.items() if _under(m, prefix)}


def test_the_graph_is_read():
    assert "hk_portable.interface.kernel" in MODULES and "hk_portable.runtime.launch" in MODULES
    assert "hk_portable.interface.kernel" in MODULES["hk_portable.runtime.launch"]
    # relative imports resolve: `from ..interface.errors import ...` in runtime/selection.py
    assert "hk_portable.interface.errors" in MODULES["hk_portable.runtime.selection"]


ABOVE_THE_INTERFACE = ["runtime", "backends", "codegen", "conformance", "kernels", "cache", "cli"]


@pytest.mark.parametrize("module", sorted(_modules_under("hk_portable.interface")))
def test_the_interface_imports_nothing_above_it(module):
    bad = sorted(i for i in MODULES[module] for layer in ABOVE_THE_INTERFACE if _under(i, f"{PACKAGE}.{layer}"))
    assert not bad, f"{module} imports {bad}: the interface must not depend on the layers built on it"


def _backend_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "backends" else None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _backend_of(m)))
def test_no_backend_imports_another(module):
    own = _backend_of(module)
    bad = sorted(i for i in MODULES[module] if _backend_of(i) not in (None, own))
    assert not bad, f"{module} (backend {own!r}) imports {bad}: a backend package imports no other backend"


def _allowed_in_a_kernel(module: str) -> bool:
    """The interface, torch, the stdlib, and sibling kernel modules (attention_bwd shares the forward's mask
    rule): every kernel module is held to this same rule, so the closure stays vendor-free."""
    top = module.split(".")[0]
    return (module == PACKAGE or _under(module, f"{PACKAGE}.interface") or _under(module, f"{PACKAGE}.kernels")
            or top in ("torch", "__future__") or top in sys.stdlib_module_names)


@pytest.mark.parametrize("module", sorted(_modules_under("hk_portable.kernels")))
def test_kernels_import_only_the_interface(module):
    bad = sorted(i for i in MODULES[module] if not _allowed_in_a_kernel(i))
    assert not bad, f"{module} imports {bad}: a kernel file uses hk_portable (as hk), hk_portable.interface, " \
                    "other kernel modules, torch and the standard library only"


# ------------------------------------------------------------------------------ architectures are capabilities
ARCH_NAME = re.compile(r"^(sm_\d+a?|gfx\d+)$")
# the backends' tables, and the hip emulator's model of its archs (a standalone package; a test holds it equal)
ARCH_TABLES = {f"{PACKAGE}.backends.cuda.archs", f"{PACKAGE}.backends.hip.archs",
               f"{PACKAGE}.backends.hip.emulator.runtime_abi"}


def _arch_name_uses(path: Path) -> list[str]:
    """Where code decides by an arch's name: a comparison with one (==, !=, in), a dict keyed by one, a subscript
    by one. Strings in messages and docstrings are words, not decisions, and are not counted."""
    def names(node) -> list[str]:
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                and ARCH_NAME.match(e.value)]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        found = []
        if isinstance(node, ast.Compare):
            found = [n for side in (node.left, *node.comparators) for n in names(side)]
        elif isinstance(node, ast.Dict):
            found = [n for k in node.keys if k is not None for n in names(k)]
        elif isinstance(node, ast.Subscript):
            found = names(node.slice)
        out += [f"line {node.lineno}: {n!r}" for n in found]
    return out


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m not in ARCH_TABLES))
def test_no_arch_name_decides_outside_the_arch_tables(module):
    path = ROOT.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    uses = _arch_name_uses(path)
    assert not uses, f"{module} decides by an arch's name ({'; '.join(uses)}): give the arch table " \
                     "(backends/<vendor>/archs.py) a capability and read that instead"


PART_NAME = re.compile(r"\b(H100|H200|H800|A100|B200|GB200|MI\d{3}X?|L40S?)\b")
# what is left of the lab in kernels/ (issue 38's tuning as data): attention's ptxas-workaround note; a new entry
# fails the test
PART_NAMES_LEFT = {f"{PACKAGE}.kernels.attention": 1}


@pytest.mark.parametrize("module", sorted(_modules_under("hk_portable.kernels")))
def test_no_device_tuning_in_kernels(module):
    """Kernels offer legal candidates; per-device preferences and thresholds live in the backends' tuning tables
    (backends/cuda/preferences.py) and device facts come from hk.compute_units: a part's name in a kernel module
    marks a number measured on it."""
    path = ROOT.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found = [line for line in path.read_text().splitlines() if PART_NAME.search(line)]
    assert len(found) <= PART_NAMES_LEFT.get(module, 0), \
        f"{module} names a device ({found}): move the tuning to a backend's table (backends/<vendor>/preferences.py)"


# ------------------------------------------------------------------------------ one owner per decision
EMITTERS = [f"{PACKAGE}.backends.cuda.codegen", f"{PACKAGE}.backends.hip.codegen"]


@pytest.mark.parametrize("module", EMITTERS)
def test_emitters_read_no_options(module):
    """An emitter renders (Program, plan) and decides nothing: the compile options are read by the backend and the
    schedule (backends/<vendor>/schedule.py), which hands the emitter a plan."""
    options = f"{module.rpartition('.')[0]}.options"
    assert not [i for i in MODULES[module] if _under(i, options)], f"{module} imports {options}"


def test_the_cuda_emitter_runs_no_analysis():
    """The cuda emitter renders the plan: it imports neither its schedule nor the shared IR patterns, whose results
    (folded scales, tile-invariant ops, what the producer warpgroup runs) the plan carries."""
    imports = MODULES[f"{PACKAGE}.backends.cuda.codegen"]
    assert not [i for i in imports if _under(i, f"{PACKAGE}.backends.cuda.schedule")
                or _under(i, f"{PACKAGE}.codegen.patterns")], sorted(imports)


def _is_plan(node) -> bool:
    """`plan` or `self.plan`: how the emitters and passes name a backend's plan."""
    return ((isinstance(node, ast.Name) and node.id == "plan")
            or (isinstance(node, ast.Attribute) and node.attr == "plan" and isinstance(node.value, ast.Name)
                and node.value.id == "self"))


def _below_plan(node) -> bool:
    """An attribute or item reached from a plan (`plan.x`, `self.plan.x[k].y`)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if _is_plan(node.value):
            return True
        node = node.value
    return False


MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear", "remove",
            "discard", "__setattr__", "__setitem__"}


def _plan_writes(path: Path) -> list[str]:
    """Where code changes a plan: an assignment to (or del of) one of its fields or what they hold, a mutating call
    on them, setattr on it, or dataclasses.replace of it (a changed copy)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        if any(_below_plan(t) for t in targets):
            out.append(f"line {node.lineno}: assigns to {ast.unparse(targets[0])}")
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in MUTATORS and _below_plan(f.value):
                out.append(f"line {node.lineno}: {ast.unparse(f)}(...)")
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in ("setattr", "replace") and node.args and (_is_plan(node.args[0]) or _below_plan(node.args[0])):
                out.append(f"line {node.lineno}: {name}({ast.unparse(node.args[0])}, ...)")
    return out


@pytest.mark.parametrize("module", EMITTERS)
def test_emitters_change_no_plan(module):
    """The emitter renders the plan it is handed: it assigns to none of its fields and mutates nothing it holds
    (cuda's Plan is frozen as well; this says so where a mutable field would let it through)."""
    writes = _plan_writes(_path(module))
    assert not writes, f"{module} changes the plan ({'; '.join(writes)}): decide it in the backend's schedule.py"


PLAN_TYPES = {"Plan", "PipelinePlan"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _under(m, f"{PACKAGE}.backends.cuda")))
def test_only_the_schedule_makes_a_cuda_plan(module):
    """backends/cuda/schedule.py alone constructs the cuda Plan and its PipelinePlans (plan.py defines them)."""
    if module == f"{PACKAGE}.backends.cuda.schedule":
        return
    tree = ast.parse(_path(module).read_text())
    made = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Name) and n.func.id in PLAN_TYPES)
        or (isinstance(n.func, ast.Attribute) and n.func.attr in PLAN_TYPES))]
    assert not made, f"{module} constructs a plan (lines {made}): only schedule.plan decides one"


MAX_LINES = 600


def _path(module: str) -> Path:
    path = ROOT.joinpath(*module.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _under(m, f"{PACKAGE}.backends")
                                          or _under(m, f"{PACKAGE}.codegen")))
def test_lowering_modules_stay_small(module):
    """A module of the lowering holds one concept a newcomer can read: split it by concept past MAX_LINES."""
    lines = len(_path(module).read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (at most {MAX_LINES}): split it by concept"


# ------------------------------------------------------------------------------ opcode roles come from the table
def _opcode_list(node) -> list[str] | None:
    """The opcode names of a tuple, list or set literal that holds two or more of them, else None."""
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return None
    names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in OPCODES]
    return names if len(names) >= 2 else None


def _bare(node):
    """A literal wrapped in frozenset/set/tuple, unwrapped."""
    wrapped = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1
    return node.args[0] if wrapped and node.func.id in ("frozenset", "set", "tuple") else node


def _hand_written_roles(path: Path) -> list[str]:
    """Where code spells an opcode role by hand: an `in` test against a literal of two or more opcode names (inline,
    or joined to another set there), or a name bound to such a literal alone. A role read off the table plus or minus
    named exceptions, bound to a name whose comment says why (layouts.GRID_OPS), is how a layout's or a schedule's
    own choice is written, and is not counted."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        found = []
        if isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
            found = [names for c in node.comparators for n in ast.walk(c) if (names := _opcode_list(n))]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            found = [names] if (names := _opcode_list(_bare(node.value))) else []
        out += [f"line {node.lineno}: {names}" for names in found]
    return out


def test_the_role_scan_sees_hand_written_lists(tmp_path):
    """Lists bound to names and inline ones are seen; a role with named exceptions and other strings are not."""
    src = tmp_path / "m.py"
    src.write_text(
        'ELEMENTWISE = ("unary", "binary")\n'
        'TAIL = frozenset({"mma", "cast"})\n'
        'ROLE = opcodes.ELEMENTWISE_OPS - {"compare", "where"}\n'
        'def f(op, kinds):\n'
        '    return (op.opcode in ELEMENTWISE + ("fill", "splat") or op.attrs["op"] in ("and", "or")\n'
        '            or any(k not in ("mma", "shared_stage") for k in kinds))\n')
    assert _hand_written_roles(src) == ["line 1: ['unary', 'binary']", "line 2: ['mma', 'cast']",
                                        "line 5: ['fill', 'splat']", "line 6: ['mma', 'shared_stage']"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _under(m, f"{PACKAGE}.backends")
                                          or _under(m, f"{PACKAGE}.codegen")))
def test_the_lowering_reads_opcode_roles_off_the_table(module):
    """Which ops are elementwise, move data between which spaces, write shared memory, ... is the opcode table's to
    say (interface/opcodes.py: each entry's role, path and effects, and the sets derived from them); the lowering
    reads those, so a new opcode joins the right sets by its table entry alone."""
    found = _hand_written_roles(_path(module))
    assert not found, f"{module} lists opcodes by hand ({'; '.join(found)}): read a role off the table " \
                      "(opcodes.ELEMENTWISE_OPS, opcodes.moves(...), opcodes.writes_shared, ...), with named " \
                      "exceptions and their reason where a layout or schedule takes less"
