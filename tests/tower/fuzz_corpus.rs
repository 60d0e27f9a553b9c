//! Replays the fuzz corpus of the forwarded-header parsers (`fuzz/corpus/client_ip`) as an
//! ordinary test, so every input the fuzzer kept is checked on stable Rust in CI.

use std::path::Path;

#[test]
fn the_client_ip_fuzz_corpus_never_panics_nor_invents_addresses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/client_ip");
    let mut cases = 0;
    let mut resolved = 0;
    let mut failed = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        // Every case runs, and the failures are named together (each prints its panic).
        match std::panic::catch_unwind(|| tests::client_ip_case(&data)) {
            Ok(client) => resolved += usize::from(client.is_some()),
            Err(_) => failed.push(path.file_name().unwrap().to_string_lossy().into_owned()),
        }
        cases += 1;
    }
    failed.sort();
    assert!(
        failed.is_empty(),
        "{} corpus cases failed: {failed:?}",
        failed.len()
    );
    assert!(
        cases >= 20,
        "only {cases} corpus files in {}",
        dir.display()
    );
    assert!(
        resolved > 0 && resolved < cases,
        "{resolved} of {cases} resolved"
    );
}
