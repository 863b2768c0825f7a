"""pytest plugin placeholder (filled in with the conformance suite)."""
