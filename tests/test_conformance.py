"""Every conformance case as a test, on --hk-backend (default: reference). See hk_portable.conformance."""
from hk_portable.conformance.test_suite import test_case  # noqa: F401 - collected here
