//! Faults beyond a clean power cut: EIO at any storage operation, failed syncs, bit rot, and
//! damaged or foreign volume files. Guards against losing flushed data after an error and
//! against damage read back as data or as a panic.

mod beyond_power_loss;
mod cleaner_read_errors;
mod damaged_files;
mod io_errors;
mod remembered_damage;
mod restart_after_failed_sync;
