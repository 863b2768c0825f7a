"""Backend plugins. Each subpackage is self-contained and imports no other backend."""
