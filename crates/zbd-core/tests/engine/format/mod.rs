//! The on-disk format and the codecs: committed fixtures of every format version keep opening,
//! and every codec round-trips real files. Guards against format changes that strand old
//! volumes and codec paths that change bytes.

mod codecs_real_files;
mod compat;
mod devices;
mod grow;
mod inline_dedup;
mod metadata_pages;
mod review13;
mod review2_inline;
mod review_inline;
mod scrub_attacks;
mod shared_items;
mod snapshots;
mod snapshots_review;
mod snapshots_review2;
mod upgrade;
mod upgrade_faults;
