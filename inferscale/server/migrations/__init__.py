"""The API-key table's Alembic revisions (``versions/``), a chain of its own with its own version table
(``inferscale_keys_schema_version``), run by :mod:`inferscale.storage.schema` when a key store is first used.

``baseline`` holds the table of the first revision, frozen: it creates a fresh table and is what a table made
before versioning is checked against.
"""
