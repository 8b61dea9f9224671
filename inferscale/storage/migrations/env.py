"""Alembic's environment for the memory store's chain: runs the revisions on the connection and version table
that :func:`inferscale.storage.schema.ensure_schema` handed over, inside its transaction."""

from alembic import context

from inferscale.storage.schema import configure_env

connection, chain = configure_env(context.config)
context.configure(connection=connection, version_table=chain.version_table)
with context.begin_transaction():
    context.run_migrations()
