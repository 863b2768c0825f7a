"""The two exceptions every part of the emulator raises."""
from __future__ import annotations


class EmulatorError(RuntimeError):
    """A kernel misbehaved under emulation (out-of-bounds access, LDS race, divergent wave operation,
    barrier deadlock, trap, timeout), or the launch itself is invalid. The message is the report."""


class CompileError(EmulatorError):
    """The source did not compile for the emulator; ``.log`` holds the compiler output."""

    def __init__(self, msg: str, log: str = ""):
        super().__init__(msg + ("\n" + log if log else ""))
        self.log = log
