//! A throwaway SAML 2.0 IdP for the tests: `scripts/simplesamlphp.sh` (Debian's
//! SimpleSAMLphp under `php -S`, the exampleauth:UserPass login form) in a scratch
//! directory of its own, stopped and removed when the guard is dropped — also when a test
//! fails. [`SimpleSamlPhp::login`] logs a user in through the real login form and answers
//! the signed `samlp:Response` the IdP posts.

use std::path::PathBuf;
use std::process::Command;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/simplesamlphp.sh");

/// A running IdP (see scripts/simplesamlphp.sh for its users, SPs and files).
pub struct SimpleSamlPhp {
    pub dir: PathBuf,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl SimpleSamlPhp {
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("aqgate-ssp-{}", &aqgate_core::engine::session::random_id()[..12]));
        // The guard first: a half-started server is stopped too.
        let mut s = Self { dir: dir.clone(), url: String::new() };
        s.url = run(&["start".as_ref(), dir.as_os_str()]).lines().last().expect("the URL").trim().to_string();
        s
    }

    /// The IdP's metadata file, as the IdP serves it.
    pub fn metadata(&self) -> PathBuf {
        self.dir.join("idp-metadata.xml")
    }

    /// The IdP's entityID.
    pub fn entity_id(&self) -> String {
        format!("{}/saml2/idp/metadata.php", self.url)
    }

    /// The IdP's TEST ONLY signing key (PEM).
    pub fn key(&self) -> PathBuf {
        self.dir.join("cert/idp.key")
    }

    /// Logs `user` in for the SP `sp` through the IdP's login form: the SAMLResponse
    /// (base64 of the signed `samlp:Response`) the IdP posts to the SP.
    pub fn login(&self, sp: &str, user: &str, password: &str) -> String {
        run(&["login".as_ref(), self.dir.as_os_str(), sp.as_ref(), user.as_ref(), password.as_ref()]).trim().to_string()
    }
}

impl Drop for SimpleSamlPhp {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(SCRIPT).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `scripts/simplesamlphp.sh ARGS`, which must succeed: its standard output.
fn run(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new("bash").arg(SCRIPT).args(args).output().expect("run scripts/simplesamlphp.sh");
    assert!(
        out.status.success(),
        "scripts/simplesamlphp.sh {args:?} (SimpleSAMLphp is required for this test; scripts/ensure-tools.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}
