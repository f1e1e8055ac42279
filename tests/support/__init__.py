"""Helpers shared by the test suites: cluster access, waiting on state, the operator process."""
