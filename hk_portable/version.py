"""The package version: its own module, so that the runtime, the backends and the reports read it without
importing the package's facade (hk_portable/__init__.py) from below."""
__version__ = "0.1.0"
