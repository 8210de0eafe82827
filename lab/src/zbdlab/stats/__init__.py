"""Statistics for `zbdlab compare`: descriptive summaries, per-cell tests, bootstrap, slopes."""
