"""Alembic migrations of the catalogue, applied programmatically when the service starts."""
