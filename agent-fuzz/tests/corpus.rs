//! Replays every fuzz target's corpus (`fuzz/corpus/<target>/`), so the inputs that found
//! bugs, and the seeds, stay regression tests on the stable toolchain.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;

#[test]
fn every_corpus_input_is_handled() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let mut replayed = 0;
    for (name, target) in agent_fuzz::TARGETS {
        let dir = corpus.join(name);
        let inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!inputs.is_empty(), "{name} has no corpus");
        for input in inputs {
            let data = std::fs::read(&input).unwrap();
            let outcome = std::panic::catch_unwind(|| target(&data));
            assert!(outcome.is_ok(), "{name} panicked on {}", input.display());
            replayed += 1;
        }
    }
    eprintln!("replayed {replayed} corpus inputs");
}
