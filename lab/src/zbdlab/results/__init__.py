"""Self-describing study results: schema, store, migration."""
