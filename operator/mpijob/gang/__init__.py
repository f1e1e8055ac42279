"""gang package."""
