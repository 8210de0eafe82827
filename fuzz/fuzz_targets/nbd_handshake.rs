//! The NBD handshake: `input` is everything a client sends before transmission.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| zbd_nbd::fuzzing::handshake(input));
