"""The memory store's Alembic revisions (``versions/``), run by :mod:`inferscale.storage.schema` on first use.

``baseline`` holds the tables of the first revision, frozen: they create a fresh database and are what a database
made before versioning is checked against.
"""
