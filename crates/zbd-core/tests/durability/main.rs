//! Durability across the whole engine: power cut at every storage operation (crash), I/O
//! errors, failed syncs and damaged files (faults), and recovery itself. Every flushed block
//! must survive, and damage must be reported, never returned as data.

#[path = "../common/mod.rs"]
mod common;

mod crash;
mod faults;
mod recovery;
