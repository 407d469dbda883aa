"""Alembic migrations for the Genqueue schema."""
