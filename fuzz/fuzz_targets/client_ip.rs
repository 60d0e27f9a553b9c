//! Fuzzes the forwarded-header parsers behind `ratewarden_tower::key::ClientIp` (the oracle is
//! `tests::client_ip_case`): arbitrary bytes as `Forwarded`, `X-Forwarded-For` or `X-Real-IP`
//! field lines from a trusted proxy must never panic, and must never resolve to an address
//! that is neither the peer nor written in them; and when our proxies append their
//! well-formed record to whatever the client sent, the client is exactly the address they
//! wrote, never one the client did.
//!
//! From `fuzz/` (nightly, or stable with `RUSTC_BOOTSTRAP=1`), writing what it finds to a
//! scratch directory so that the committed corpus stays small:
//! `cargo fuzz run client_ip /tmp/client_ip corpus/client_ip -- -dict=client_ip.dict`.
//! The corpus in `corpus/client_ip` is replayed on stable by the `tower` integration tests.
//! To refresh it: `cargo fuzz cmin client_ip /tmp/client_ip -- -use_counters=0` (edges only,
//! a couple of hundred small files), then copy that and the named regression cases back.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = tests::client_ip_case(data);
});
