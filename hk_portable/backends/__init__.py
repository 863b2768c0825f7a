"""Backend plugins and their registry. Each subpackage is self-contained and imports no other backend.

`hk.backends()` is this package, called: importing a submodule (hk_portable.backends.registry) binds
the package to the attribute `backends` of hk_portable, which would otherwise replace a function of
that name, so the package itself is made callable."""
import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self):
        """Every installed backend with whether it can run here and why not (list of BackendInfo)."""
        from . import registry
        return registry.report()


sys.modules[__name__].__class__ = _CallablePackage
