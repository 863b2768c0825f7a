"""Backend plugins. Each subpackage is self-contained and imports no other backend; the registry that
discovers them is hk_portable.runtime.registry.

`hk.backends()` is this package, called: importing a submodule (hk_portable.backends.cuda) binds
the package to the attribute `backends` of hk_portable, which would otherwise replace a function of
that name, so the package itself is made callable."""
import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self):
        """Every installed backend with whether it can run here and why not (list of BackendInfo)."""
        from ..runtime import registry
        return registry.report()


sys.modules[__name__].__class__ = _CallablePackage
