//! NBD protocol server over any block export. Knows nothing of compression.
