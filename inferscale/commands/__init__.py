"""The memory and key commands of ``inferscale``: ``add``, ``search``, ``list``, ``delete``, ``history``, ``chat``
and ``keys``.

- :mod:`~inferscale.commands.options`: the options they share, each declared once (parent parsers);
- :mod:`~inferscale.commands.client`: the one place a command builds its client (local or ``--host``) or key store;
- :mod:`~inferscale.commands.run`: one call, its spinner and its output;
- :mod:`~inferscale.commands.output`: JSON for ``--json``, rich tables for people;
- :mod:`~inferscale.commands.memory`, :mod:`~inferscale.commands.chat`, :mod:`~inferscale.commands.keys`: the
  commands.

Parsing imports nothing heavy: the client, torch and rich load when a command runs.
"""
