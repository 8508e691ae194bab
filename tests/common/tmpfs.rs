//! Small filesystems for the tests of a full disk: a tmpfs mounted for the test (the suite
//! runs as root, as CI does) and a filler file that takes all its free space.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of `mb` MiB mounted on a new directory; unmounted when dropped.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    pub fn mount(tag: &str, mb: u32) -> Self {
        let dir = std::env::temp_dir().join(format!("aqgate-test-full-{tag}-{}", std::process::id()));
        let _ = Command::new("umount").arg("-l").arg(&dir).stderr(std::process::Stdio::null()).status();
        std::fs::create_dir_all(&dir).expect("mount point");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m,mode=0777"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(
            st.success(),
            "mounting a {mb} MiB tmpfs on {} failed: the disk-full tests need root (as CI runs them)",
            dir.display()
        );
        Self { dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Writes `dir/filler` until the filesystem has no space left; its path.
pub fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let p = dir.join("filler");
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&p).expect("filler");
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => panic!("filling {}: {e}", p.display()),
        }
    }
    // The last partial pages too.
    let small = [0u8; 512];
    while let Ok(n) = f.write(&small) {
        if n == 0 {
            break;
        }
    }
    let _ = f.sync_all();
    p
}
