//! Replays the fuzz corpus of the forwarded-header parsers (`fuzz/corpus/client_ip`) as an
//! ordinary test, so every input the fuzzer kept is checked on stable Rust in CI.

use std::path::Path;

#[test]
fn the_client_ip_fuzz_corpus_never_panics_nor_invents_addresses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/client_ip");
    let mut cases = 0;
    let mut resolved = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        resolved += usize::from(tests::client_ip_case(&data).is_some());
        cases += 1;
    }
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
