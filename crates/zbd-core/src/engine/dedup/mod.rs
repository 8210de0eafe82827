//! Deduplication in the engine (docs/design.md, "Deduplication"): the offline pass over a
//! whole volume (`pass.rs`, `zbd dedup`) and inline deduplication on the write path
//! (`inline.rs`, `--dedup on`). Both share a block only after comparing its bytes with the
//! candidate's, read from the medium or its open extent, never from the read cache.

mod inline;
mod pass;

pub(crate) use inline::InlineDedup;
pub use pass::DedupReport;
