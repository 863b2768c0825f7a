"""The conformance suite: op and kernel cases, one tolerance table, a runner, reports, a pytest plugin.

    from hk_portable.conformance import run
    result = run("reference", patterns="gemm")     # RunResult: .results, .summary, .ok
"""
from .cases import Case, Check, Setup, all_cases
from .runner import CaseResult, RunResult, Session, run, select_cases

__all__ = ["Case", "Check", "Setup", "all_cases", "CaseResult", "RunResult", "Session", "run", "select_cases"]
