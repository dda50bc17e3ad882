//! Every input kept in `fuzz/regressions/replay/`, replayed in-process
//! through the same check the `replay` fuzz target runs.

#[path = "../../../fuzz/src/replay.rs"]
mod replay_check;

use std::fs;
use std::path::Path;

#[test]
fn replay_regressions_still_pass() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/replay");
    let mut count = 0;
    for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a readable directory entry").path();
        let data = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("replaying {}", path.display());
        replay_check::check_replay(&data);
        count += 1;
    }
    assert!(count > 0, "{} holds no input", dir.display());
}
