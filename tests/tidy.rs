//! Tidiness of the repository itself: it builds and runs from a clone anywhere, so no
//! tracked file may point at a directory beside it.

use std::process::Command;

#[test]
fn no_tracked_file_points_outside_the_repository() {
    // Spelled in two parts, so that this file does not name it itself.
    let outside = format!("../{}", "shared");
    let out = Command::new("git")
        .args(["grep", "-n", "-F", &outside, "--", "."])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git grep");
    // Exit status 1: no match; anything but 0 or 1 (e.g. not a git checkout) fails.
    let status = out.status.code();
    assert!(matches!(status, Some(0 | 1)), "git grep failed: {}", String::from_utf8_lossy(&out.stderr));
    let hits = String::from_utf8_lossy(&out.stdout);
    assert!(hits.trim().is_empty(), "tracked files name {outside}, which a clone elsewhere does not have:\n{hits}");
}
