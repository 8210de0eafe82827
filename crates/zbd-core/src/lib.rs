//! zbd engine: compressed, log-structured, crash-safe block store.
