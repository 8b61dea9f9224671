"""The memory store's revisions, oldest first: ``v0001_baseline``."""
