//! Trained dictionaries: training, installing (also during a checkpoint), naming them in
//! blocks, retiring and reusing their ids and room. Guards against a block decoded with another
//! dictionary than its own, and a dictionary lost or reused while a block still names it.

mod install_during_checkpoint;
mod retirement;
mod retirement_races;
mod training;
