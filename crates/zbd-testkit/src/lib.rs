//! Helpers shared by the integration tests of `zbd-nbd` and `zbd`: one NBD test client (a raw
//! one that sends exactly the bytes a test asks for, and a minimal blocking one that reports
//! which requests were acknowledged) and running external tools. Dev-only (`publish = false`).

pub mod nbd;
pub mod process;
