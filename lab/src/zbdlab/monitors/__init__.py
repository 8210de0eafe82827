"""What zbdlab measures around each operation: machine CPU, device I/O, page cache, environment."""
