//! The NBD request reader and checker: byte 0 picks the session, the rest is the request stream.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| zbd_nbd::fuzzing::requests(input));
