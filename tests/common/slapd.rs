//! A throwaway OpenLDAP server for the tests that need a real directory: `scripts/slapd.sh`
//! in a scratch directory of its own, loaded with the demo directory (and any extra LDIF),
//! stopped and its directory removed when the guard is dropped — also when a test fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aqgate_directory::DirectoryConfig;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/slapd.sh");

/// A running slapd (see scripts/slapd.sh for the files it keeps in `dir`).
pub struct Slapd {
    pub dir: PathBuf,
    /// `ldap://127.0.0.1:PORT` (StartTLS offered).
    pub url: String,
    /// `ldaps://127.0.0.1:PORT`.
    pub ldaps_url: String,
}

impl Slapd {
    /// slapd with the demo directory.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// slapd with the demo directory, then `extra_ldif` loaded in order.
    pub fn start_with(extra_ldif: &[&Path]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("aqgate-slapd-{}", &aqgate_core::engine::session::random_id()[..12]));
        let mut args = vec![PathBuf::from("start"), dir.clone()];
        args.extend(extra_ldif.iter().map(|p| p.to_path_buf()));
        // The guard first: a half-started server is stopped too.
        let mut s = Slapd { dir, url: String::new(), ldaps_url: String::new() };
        s.url = run(&args).lines().last().expect("slapd.sh prints the URL").trim().to_string();
        s.ldaps_url = s.file("ldaps_url");
        s
    }

    /// Stops the server (the directory stays, for [`Slapd::restart`]).
    pub fn stop(&self) {
        run(&[PathBuf::from("stop"), self.dir.clone()]);
    }

    /// Starts the stopped server again, on the same ports.
    pub fn restart(&self) {
        let url = run(&[PathBuf::from("start"), self.dir.clone()]);
        assert_eq!(url.lines().last().map(str::trim), Some(self.url.as_str()), "restart keeps the port");
    }

    /// The TEST ONLY bind DN and password.
    pub fn bind_dn(&self) -> String {
        self.file("bind_dn")
    }

    pub fn bind_password(&self) -> String {
        self.file("bind_password")
    }

    pub fn bind_password_file(&self) -> PathBuf {
        self.dir.join("bind_password")
    }

    /// The TEST ONLY CA of the server's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("tls/ca.pem")
    }

    /// The server's process id.
    pub fn pid(&self) -> String {
        self.file("slapd.pid")
    }

    /// A directory configuration for `url` (this server's, in one of its forms), bound
    /// with the test credentials, with a 2 s timeout.
    pub fn config(&self, url: &str) -> DirectoryConfig {
        DirectoryConfig {
            url: Some(url.to_string()),
            bind_dn: Some(self.bind_dn()),
            bind_password: Some(self.bind_password()),
            timeout: Duration::from_secs(2),
            ..DirectoryConfig::default()
        }
    }

    fn file(&self, name: &str) -> String {
        let p = self.dir.join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_string()
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        // Stopped before its directory (which holds the pid file) goes.
        let _ = Command::new("bash").arg(SCRIPT).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `scripts/slapd.sh ARGS`, which must succeed: its standard output.
fn run(args: &[PathBuf]) -> String {
    let out = Command::new("bash").arg(SCRIPT).args(args).output().expect("run scripts/slapd.sh");
    assert!(
        out.status.success(),
        "scripts/slapd.sh {args:?} (slapd is required for this test; scripts/ensure-tools.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}
