//! A real browser for the tests: Debian's headless Chromium driven over WebDriver by
//! ChromeDriver (both installed by `scripts/ensure-chromium.sh`), through a `fantoccini`
//! client. [`Browser::start`] starts `chromedriver` on a free port (killed when the
//! `Browser` is dropped) and a Chromium with a fresh profile and the flags that keep it off
//! the network (no background networking, component updates, sync or QUIC). Chromium or
//! ChromeDriver missing is a failure, never a skip.
//!
//! What a browser test calls:
//!
//! - [`Browser::start`], then [`Browser::visit`] (goes to a URL and fails the test on any
//!   console error or CSP violation the page caused), or [`Browser::goto`] and the checks
//!   by hand;
//! - [`Browser::console_errors`]: the browser's console messages of level error (SEVERE
//!   in ChromeDriver's log: `console.error`, uncaught exceptions, failed loads, refused
//!   inline scripts) since the last call, but for the browser's own look for a
//!   `/favicon.ico`;
//! - [`Browser::csp_violations`]: the `securitypolicyviolation` events of the current page,
//!   caught by a listener installed before any script of every document (through the
//!   DevTools protocol, which the page's own CSP does not govern);
//! - [`Browser::assert_clean`]: both empty;
//! - [`Browser::text`]: the page's visible text; [`Browser::client`] for everything else
//!   `fantoccini` offers (clicks, forms, `execute`);
//! - [`Browser::screenshot`]: a PNG into [`screenshot_dir`].

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::http::Method;
use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

use super::free_port;

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// The flags every test browser runs with: headless, as root (no sandbox), and nothing
/// that reaches out to the network by itself.
pub const FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// Installed on every new document before its own scripts: keeps each CSP violation's
/// directive, blocked URI and source position in `window.__aqgateCsp`.
const CSP_LISTENER: &str = "window.__aqgateCsp = [];\
    document.addEventListener('securitypolicyviolation', function (e) {\
      window.__aqgateCsp.push(e.violatedDirective + ' blocked ' + (e.blockedURI || '(inline)')\
        + ' at ' + e.sourceFile + ':' + e.lineNumber);\
    });";

/// Where screenshots go: `$AQGATE_SCREENSHOTS`, else `screenshots/` in Cargo's temporary
/// directory for integration tests (under `target/`).
pub fn screenshot_dir() -> PathBuf {
    std::env::var_os("AQGATE_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots"))
}

/// A headless Chromium under ChromeDriver; both end with it.
pub struct Browser {
    client: Option<Client>,
    driver: Child,
    profile: PathBuf,
}

impl Browser {
    /// Starts ChromeDriver and a Chromium session. Panics, naming the script that installs
    /// them, when either program is missing.
    pub async fn start() -> Self {
        for p in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(p).exists(),
                "{p} is missing: the browser tests need Debian's chromium and chromium-driver \
                 (scripts/ensure-chromium.sh installs them)"
            );
        }
        let port = free_port();
        // Its own process group, with the Chromium it starts: dropping the browser kills them all.
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {CHROMEDRIVER}: {e}"));
        let profile = std::env::temp_dir()
            .join(format!("aqgate-test-chromium-{}", &aqgate_core::engine::session::random_id()[..12]));
        std::fs::create_dir_all(&profile).expect("the browser profile's directory");
        // Dropped (ChromeDriver killed, the profile removed) if anything below fails.
        let mut b = Self { client: None, driver, profile };
        let url = format!("http://127.0.0.1:{port}");
        b.wait_driver(port);
        let mut args: Vec<String> = FLAGS.iter().map(|f| f.to_string()).collect();
        args.push(format!("--user-data-dir={}", b.profile.display()));
        args.push("--window-size=1280,900".into());
        let mut caps = Capabilities::new();
        caps.insert("goog:chromeOptions".into(), json!({ "binary": CHROMIUM, "args": args }));
        caps.insert("goog:loggingPrefs".into(), json!({ "browser": "ALL" }));
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("a Chromium session through ChromeDriver at {url}: {e}"));
        b.client = Some(client);
        b.raw("goog/cdp/execute", json!({ "cmd": "Page.enable", "params": {} })).await;
        b.raw(
            "goog/cdp/execute",
            json!({ "cmd": "Page.addScriptToEvaluateOnNewDocument", "params": { "source": CSP_LISTENER } }),
        )
        .await;
        b
    }

    fn wait_driver(&mut self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = self.driver.try_wait() {
                panic!("{CHROMEDRIVER} exited ({st}) before listening on port {port}");
            }
            assert!(Instant::now() < deadline, "{CHROMEDRIVER}: port {port} never opened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The WebDriver client, for what this harness does not wrap.
    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("a started browser")
    }

    /// A command of ChromeDriver's own (`se/log`, `goog/cdp/execute`) on this browser's WebDriver connection.
    async fn raw(&self, path: &'static str, body: Value) -> Value {
        self.client()
            .issue_cmd(Raw { path, body: body.clone() })
            .await
            .unwrap_or_else(|e| panic!("ChromeDriver {path} {body}: {e}"))
    }

    /// Goes to `url` and waits for it to load.
    pub async fn goto(&self, url: &str) {
        self.client().goto(url).await.unwrap_or_else(|e| panic!("go to {url}: {e}"));
    }

    /// Goes to `url` and fails on any console error or CSP violation it caused; returns
    /// the page's visible text.
    pub async fn visit(&self, url: &str) -> String {
        self.goto(url).await;
        self.assert_clean(url).await;
        self.text().await
    }

    /// The page's visible text (`document.body.innerText`).
    pub async fn text(&self) -> String {
        let v = self.client().execute("return document.body ? document.body.innerText : '';", vec![]).await;
        v.unwrap_or_else(|e| panic!("read the page's text: {e}")).as_str().unwrap_or_default().to_string()
    }

    /// The console messages of level error since the last call (ChromeDriver hands each
    /// entry out once), each as `source: message`.
    pub async fn console_errors(&self) -> Vec<String> {
        let log = self.raw("se/log", json!({ "type": "browser" })).await;
        let entries = log.as_array().unwrap_or_else(|| panic!("the browser log is not a list: {log}"));
        entries
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            // The browser's own look for an icon, not the page's doing.
            .filter(|e| !e["message"].as_str().is_some_and(|m| m.contains("/favicon.ico - ")))
            .map(|e| format!("{}: {}", e["source"].as_str().unwrap_or("?"), e["message"].as_str().unwrap_or("?")))
            .collect()
    }

    /// The CSP violations of the current page so far (`directive blocked URI at source:line`).
    pub async fn csp_violations(&self) -> Vec<String> {
        let v = self.client().execute("return window.__aqgateCsp;", vec![]).await;
        let v = v.unwrap_or_else(|e| panic!("read the CSP violations: {e}"));
        let list = v.as_array().unwrap_or_else(|| panic!("no CSP listener on this page (got {v})"));
        list.iter().map(|s| s.as_str().unwrap_or_default().to_string()).collect()
    }

    /// Fails if the page caused a console error or a CSP violation; `what` names it.
    pub async fn assert_clean(&self, what: &str) {
        let errors = self.console_errors().await;
        let violations = self.csp_violations().await;
        assert!(
            errors.is_empty() && violations.is_empty(),
            "{what}: console errors {errors:#?}, CSP violations {violations:#?}"
        );
    }

    /// A screenshot of the window as `NAME.png` in [`screenshot_dir`]; returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client().screenshot().await.unwrap_or_else(|e| panic!("screenshot {name}: {e}"));
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }

    /// Ends the session (Chromium exits); dropping the browser kills ChromeDriver.
    pub async fn close(mut self) {
        if let Some(c) = self.client.take() {
            c.close().await.expect("end the browser session");
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: ChromeDriver, Chromium and Chromium's helpers.
        // (`kill -s KILL -- -PGID`: procps's kill reads `kill -KILL -PGID` as `kill -1`, every
        // process there is.)
        let group = self.driver.id();
        if group > 1 {
            let _ = Command::new("kill").args(["-s", "KILL", "--", &format!("-{group}")]).status();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// A POST of ChromeDriver's extension commands on the current session.
#[derive(Debug)]
struct Raw {
    path: &'static str,
    body: Value,
}

type Url = reqwest::Url;

impl WebDriverCompatibleCommand for Raw {
    fn endpoint(&self, base: &Url, session: Option<&str>) -> Result<Url, <Url as std::str::FromStr>::Err> {
        base.join(&format!("session/{}/{}", session.unwrap_or_default(), self.path))
    }

    fn method_and_body(&self, _url: &Url) -> (Method, Option<String>) {
        (Method::POST, Some(self.body.to_string()))
    }
}
