"""The conformance suite as pytest tests: `pytest --pyargs hk_portable.conformance --hk-backend NAME`.

(The project's own `pytest` collects this through tests/test_conformance.py.)"""


def test_case(hk_case, hk_conformance):
    hk_conformance(hk_case)
