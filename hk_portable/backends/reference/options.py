"""The reference backend's compile options: none (it interprets the Program as it is), but the same
frozen dataclass every backend has, so an unknown key is refused here too."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...codegen.options import BackendOptions


@dataclass(frozen=True)
class ReferenceOptions(BackendOptions):
    backend: ClassVar[str] = "reference"
