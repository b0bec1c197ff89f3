"""Route modules, one per resource, plus health/metrics and the dashboard pages."""
