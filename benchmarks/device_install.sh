# Sourced by the device-machine scripts (h200_cuda_check.sh, model_check.sh) after they define note() and OUT:
# the carried wheels (.whl) into /tmp/site, hk_portable installed editable (or, without a usable setuptools, on
# PYTHONPATH with a hand-made dist-info: stevedore reads its entry points), bytecode compiled, HK set.
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/env.txt" 2>&1; then
    mkdir -p /tmp/site/hk_portable-0.0.dist-info
    printf 'Metadata-Version: 2.1\nName: hk-portable\nVersion: 0.0\n' > /tmp/site/hk_portable-0.0.dist-info/METADATA
    python3 - <<'PY' > /tmp/site/hk_portable-0.0.dist-info/entry_points.txt
import tomllib
eps = tomllib.load(open("pyproject.toml", "rb"))["project"]["entry-points"]
for group, items in eps.items():
    print(f"[{group}]")
    for k, v in items.items():
        print(f"{k} = {v}")
    print()
PY
    export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    note "install: editable install failed (see env.txt); using PYTHONPATH + a hand-made dist-info"
fi
HK="python3 -m hk_portable.cli"
# bytecode, as a wheel install writes it: without it each new process compiles the package's sources again, which
# a "first call in a new process" figure would count (65 ms on the H200, 2026-12-04)
python3 -m compileall -q hk_portable >/dev/null 2>&1 || note "compileall failed: first-call figures include compiling"
# the compiled launcher and op replay (runtime/clauncher.py, runtime/opfast.py) built here, in the foreground:
# a timed step must not meet the background build of the first GPU op call
python3 -c 'from hk_portable.runtime import clauncher, opfast
print("GPU launches:", clauncher.describe()); m = opfast.load(); print("op calls:", opfast.describe())' 2>&1 | tail -2
