"""The reference backend: interprets Programs with torch; the executable specification."""
from .backend import ReferenceBackend

__all__ = ["ReferenceBackend"]
