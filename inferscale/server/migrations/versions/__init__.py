"""The API-key table's revisions, oldest first: ``v0001_api_keys``."""
