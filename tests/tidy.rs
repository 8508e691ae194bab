//! Tidiness of the repository itself, checked rather than hoped for: it builds and runs
//! from a clone anywhere (no tracked file points at a directory beside it), every module
//! says what it is, no file grows past what a reader takes in, the crates depend on each
//! other only in the allowed directions, and no module depends on another that depends
//! back on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The tracked files matching `pattern` (git pathspec), relative to the root.
fn tracked(pattern: &str) -> Vec<String> {
    let out = Command::new("git").args(["ls-files", "--", pattern]).current_dir(root()).output().expect("git ls-files");
    assert!(out.status.success(), "git ls-files: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(String::from).filter(|f| root().join(f).exists()).collect()
}

fn read(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn no_tracked_file_points_outside_the_repository() {
    // Spelled in two parts, so that this file does not name it itself.
    let outside = format!("../{}", "shared");
    let out = Command::new("git")
        .args(["grep", "-n", "-F", &outside, "--", "."])
        .current_dir(root())
        .output()
        .expect("git grep");
    // Exit status 1: no match; anything but 0 or 1 (e.g. not a git checkout) fails.
    let status = out.status.code();
    assert!(matches!(status, Some(0 | 1)), "git grep failed: {}", String::from_utf8_lossy(&out.stderr));
    let hits = String::from_utf8_lossy(&out.stdout);
    assert!(hits.trim().is_empty(), "tracked files name {outside}, which a clone elsewhere does not have:\n{hits}");
}

#[test]
fn every_module_starts_with_a_doc_header() {
    let missing: Vec<String> =
        tracked("*.rs").into_iter().filter(|f| !read(f).trim_start().starts_with("//!")).collect();
    assert!(missing.is_empty(), "these files do not start with a //! header saying what they are: {missing:?}");
}

/// Lines of `text` before its test module (the convention here: `#[cfg(test)]` then
/// `mod tests` at the end of a file, or in a file of its own).
fn non_test_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .position(|(i, l)| {
            *l == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|n| n.starts_with("mod ") && n.ends_with('{'))
        })
        .unwrap_or(lines.len())
}

#[test]
fn no_source_file_is_over_eight_hundred_lines_of_code() {
    const LIMIT: usize = 800;
    let big: Vec<(String, usize)> = tracked("*.rs")
        .into_iter()
        .filter(|f| !f.starts_with("tests/") && !f.ends_with("/tests.rs") && !f.starts_with("fuzz/"))
        .map(|f| {
            let n = non_test_lines(&read(&f));
            (f, n)
        })
        .filter(|(_, n)| *n > LIMIT)
        .collect();
    assert!(big.is_empty(), "split these along their sections (non-test lines over {LIMIT}): {big:?}");
}

/// The crates `package` depends on, directly or not (normal dependencies, this platform).
fn dependency_tree(package: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--locked", "--offline", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}"])
        .current_dir(root())
        .output()
        .expect("cargo tree");
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}

#[test]
fn the_crates_depend_on_each_other_only_downwards() {
    // What each library crate may not reach, however indirectly: the protocol has no I/O;
    // the core reaches a database, the network, a mail relay or a directory only through
    // its interfaces; the backends do not reach the HTTP edge or each other's clients;
    // the SAML verifier (samael, libxml2, xmlsec) is the HTTP edge's alone, and reaches no
    // engine, database or network; notifications reach no database but through the engine.
    let io = [
        "tokio",
        "sqlx",
        "reqwest",
        "lettre",
        "axum",
        "openssl",
        "ldap3",
        "hyper",
        "mio",
        "samael",
        "libxml",
        "aqgate-saml",
    ];
    let rules: [(&str, &[&str]); 11] = [
        ("aqgate-proto", &io),
        (
            "aqgate-core",
            &[
                "sqlx",
                "reqwest",
                "lettre",
                "axum",
                "openssl",
                "ldap3",
                "hyper",
                "samael",
                "libxml",
                "aqgate-store",
                "aqgate-mail",
                "aqgate-directory",
                "aqgate-saml",
            ],
        ),
        ("aqgate-store", &["axum", "reqwest", "lettre", "openssl", "ldap3", "aqgate-mail", "aqgate-directory"]),
        ("aqgate-directory", &["sqlx", "axum", "reqwest", "lettre", "openssl", "aqgate-store", "aqgate-mail"]),
        ("aqgate-mail", &["sqlx", "axum", "ldap3", "samael", "aqgate-store", "aqgate-directory"]),
        // Notifications reach the store only through the engine, and no broker or HTTP server.
        ("aqgate-notify", &["sqlx", "axum", "samael", "aqgate-store", "aqgate-saml", "lapin", "async-nats", "rumqttc"]),
        // Propagation and the gateway reach the store only through the engine, and serve no HTTP.
        ("aqgate-propagate", &["sqlx", "axum", "samael", "aqgate-store", "aqgate-saml", "aqgate-http", "aqgate-admin"]),
        // The HTTP edge reaches the store only through the engine: no database driver, no
        // broker client, none of the crates that hold them.
        (
            "aqgate-http",
            &[
                "sqlx",
                "aqgate-store",
                "lapin",
                "async-nats",
                "rumqttc",
                "aqgate-propagate",
                "aqgate-admin",
                "aqgate-console",
            ],
        ),
        // Administration reads through the store's interface and serves no HTTP.
        ("aqgate-admin", &["axum", "samael", "aqgate-http", "aqgate-saml", "aqgate-console"]),
        // The client speaks IDAP over HTTP: no engine, store, database, broker or server.
        (
            "aqgate-client",
            &["sqlx", "axum", "samael", "aqgate-core", "aqgate-store", "aqgate-saml", "lapin", "async-nats", "rumqttc"],
        ),
        (
            "aqgate-saml",
            &[
                "tokio",
                "sqlx",
                "axum",
                "reqwest",
                "lettre",
                "ldap3",
                "hyper",
                "aqgate-core",
                "aqgate-store",
                "aqgate-mail",
            ],
        ),
    ];
    let mut wrong = Vec::new();
    for (package, forbidden) in rules {
        let tree = dependency_tree(package);
        assert!(tree.contains(package), "cargo tree -p {package} does not list {package}: {tree:?}");
        for f in forbidden {
            if tree.contains(*f) {
                wrong.push(format!("{package} depends on {f}"));
            }
        }
    }
    assert!(wrong.is_empty(), "forbidden dependency edges: {wrong:?}");
}

/// The crates `package` depends on without what it reaches through `through`, one of them
/// (`cargo tree --prune`: that crate and its own dependencies left out, unless reached
/// another way too).
fn dependency_tree_without(package: &str, through: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--locked", "--offline", "-p", package, "-e", "normal", "--prune", through])
        .args(["--prefix", "none", "--format", "{p}"])
        .current_dir(root())
        .output()
        .expect("cargo tree");
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}

/// The library crates of the workspace (`crates/*`), by package name.
fn library_crates() -> Vec<String> {
    let names: Vec<String> = tracked("crates/*/Cargo.toml")
        .iter()
        .filter(|f| f.matches('/').count() == 2)
        .filter_map(|f| {
            read(f)
                .lines()
                .find_map(|l| l.strip_prefix("name = \"").and_then(|n| n.strip_suffix('"')).map(String::from))
        })
        .collect();
    assert!(names.len() >= 10, "the library crates: {names:?}");
    names
}

/// The database driver is reached only through the store, and the broker clients only
/// through propagation: every other library crate that has one in its tree has it only
/// because it depends on that crate by design (administration on the store, which it
/// opens). The binary's package is left out: its load generator (`src/bin/aqgate-bench`)
/// talks to the brokers directly, and the runtime's sizing reads a database URL with the
/// driver's own parser.
#[test]
fn the_database_driver_and_the_broker_clients_are_reached_only_through_their_crates() {
    let rules: [(&str, &[&str]); 2] =
        [("aqgate-store", &["sqlx"]), ("aqgate-propagate", &["lapin", "async-nats", "rumqttc"])];
    let mut wrong = Vec::new();
    for package in library_crates() {
        for (owner, clients) in rules {
            if package == owner {
                continue;
            }
            let whole = dependency_tree(&package);
            let tree = if whole.contains(owner) { dependency_tree_without(&package, owner) } else { whole };
            for c in clients.iter().filter(|c| tree.contains(**c)) {
                wrong.push(format!("{package} reaches {c} other than through {owner}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// The web console reaches the store only through the core's `Store` trait and the
/// administration read models: no database driver, store backend, broker client or
/// background worker among its own dependencies, none named in its sources. (The HTTP
/// edge and administration do not know it: the rules above; the binary merges its routes.)
#[test]
fn the_console_reaches_the_store_only_through_the_read_models() {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--locked", "--offline", "-p", "aqgate-console", "-e", "normal", "--depth", "1"])
        .args(["--prefix", "none", "--format", "{p}"])
        .current_dir(root())
        .output()
        .expect("cargo tree");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    let direct: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    assert!(direct.contains("aqgate-admin") && direct.contains("aqgate-http"), "{direct:?}");
    for f in
        ["sqlx", "aqgate-store", "aqgate-propagate", "aqgate-notify", "aqgate-mail", "lapin", "async-nats", "rumqttc"]
    {
        assert!(!direct.contains(f), "aqgate-console depends on {f} itself");
    }
    let files = tracked("crates/aqgate-console/src/*.rs");
    assert!(files.iter().any(|f| f.ends_with("/lib.rs")), "the console's files: {files:?}");
    for f in files {
        let text = read(&f);
        for word in ["aqgate_store", "sqlx", "aqgate_propagate", "lapin", "async_nats", "rumqttc"] {
            assert!(!text.contains(word), "{f} names {word}");
        }
    }
}

/// The root package is a thin binary over the crates: argv, configuration, wiring, run. It
/// has no library target, and its code outside `src/bin/` (the load generator) stays small.
#[test]
fn the_binary_is_thin() {
    const LIMIT: usize = 2000;
    assert!(!root().join("src/lib.rs").exists(), "src/lib.rs: the root package is a binary only");
    let files: Vec<String> = tracked("src/*.rs").into_iter().filter(|f| !f.starts_with("src/bin/")).collect();
    assert!(files.iter().any(|f| f == "src/main.rs"), "the binary's files: {files:?}");
    let lines: usize = files.iter().map(|f| non_test_lines(&read(f))).sum();
    assert!(lines <= LIMIT, "the binary has {lines} non-test lines outside src/bin/ (at most {LIMIT}): {files:?}");
}

/// What the binary's default build compiles and links (normal and build dependencies): the
/// newcomer's `cargo run --release -- serve` needs only a Rust and a C toolchain, so it
/// builds OpenSSL from source and has nothing that needs libclang, libxml2 or xmlsec1.
#[test]
fn the_default_build_needs_no_system_library_but_libc() {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--locked", "--offline", "-p", "aqgate", "-e", "normal,build", "--prefix", "none"])
        .args(["--format", "{p}"])
        .current_dir(root())
        .output()
        .expect("cargo tree");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    let tree: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    assert!(tree.contains("openssl-src"), "the default build must vendor OpenSSL: {tree:?}");
    let system = ["samael", "libxml", "bindgen", "clang-sys", "aqgate-saml", "xmlsec"];
    let found: Vec<&str> = system.into_iter().filter(|c| tree.contains(*c)).collect();
    assert!(found.is_empty(), "the default build needs system libraries through {found:?}");
}

#[test]
fn the_engine_reaches_time_and_tasks_only_through_the_clock() {
    // tokio's sync primitives are fine (no I/O); its timers and tasks are the clock's and the
    // process's business.
    let forbidden = [
        "tokio::time",
        "tokio::spawn",
        "tokio::task",
        "tokio::net",
        "std::thread",
        "TcpStream",
        "UdpSocket",
        "ToSocketAddrs",
        "std::fs",
        "SystemTime",
        "Instant::now",
    ];
    let mut hits = Vec::new();
    let files = tracked("crates/aqgate-core/src/*.rs");
    assert!(files.len() >= 10, "the core's files: {files:?}");
    for f in files {
        if f.ends_with("/clock.rs") {
            continue;
        }
        let text = read(&f);
        let code =
            &text[..text.lines().take(non_test_lines(&text)).map(|l| l.len() + 1).sum::<usize>().min(text.len())];
        for word in forbidden {
            if code.contains(word) {
                hits.push(format!("{f}: {word}"));
            }
        }
    }
    assert!(hits.is_empty(), "{hits:?}");
}

#[test]
fn the_http_edge_names_no_store_backend() {
    let files = tracked("crates/aqgate-http/src/*.rs");
    assert!(files.iter().any(|f| f.ends_with("/servlet.rs")), "the HTTP crate's files: {files:?}");
    for f in files {
        let text = read(&f);
        for word in ["aqgate_store", "sqlx", "postgres", "sqlite", "Postgres", "Sqlite"] {
            assert!(!text.contains(word), "{f} names {word}");
        }
    }
}

/// The module a source file is, as a path from its crate's root (`["engine", "dequeue"]`),
/// and that crate's source root.
fn module_of(file: &str) -> Option<(String, Vec<String>)> {
    let (krate, rest) = if let Some(rest) = file.strip_prefix("src/") {
        ("aqgate".to_string(), rest)
    } else {
        let rest = file.strip_prefix("crates/")?;
        let (krate, rest) = rest.split_once("/src/")?;
        (krate.to_string(), rest)
    };
    if rest.starts_with("bin/") {
        return None;
    }
    let mut parts: Vec<String> = rest.trim_end_matches(".rs").split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    Some((krate, parts))
}

/// Finds a cycle in `graph`, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let i = path.iter().position(|p| p == n).unwrap_or(0);
                let mut c = path[i..].to_vec();
                c.push(n.to_string());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

/// The first names after each `prefix` in `code`: `super::lease::Doing` names `lease`, and a
/// grouped import `super::{lease, job::Doing, Stats}` names `lease`, `job` and `Stats`.
fn named_after(code: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String { s.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        let rest = &code[i + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(ident(rest));
            continue;
        };
        // The group's items at its own level (nested groups belong to their item).
        let (mut depth, mut item) = (0usize, String::new());
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(ident(&item));
                    item.clear();
                    continue;
                }
                _ => {}
            }
            if depth == 0 {
                item.push(c);
            }
        }
        out.push(ident(&item));
    }
    out.retain(|n| !n.is_empty() && n != "self");
    out
}

#[test]
fn no_two_modules_depend_on_each_other() {
    // Per crate: module A depends on its sibling B when A's files name `crate::B` (top-level
    // modules) or `super::B` (modules of one directory). A module and its own submodules
    // are one unit; between siblings, dependencies go one way.
    let mut graphs: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let files: Vec<String> =
        tracked("*.rs").into_iter().filter(|f| f.starts_with("src/") || f.starts_with("crates/")).collect();
    for f in &files {
        let Some((krate, module)) = module_of(f) else { continue };
        let text = read(f);
        let code: String = text
            .lines()
            .take(non_test_lines(&text))
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let graph = graphs.entry(krate).or_default();
        let mut edge = |from: String, to: String| {
            if from != to {
                graph.entry(from).or_default().insert(to);
            }
        };
        let top = module.first().cloned().unwrap_or_default();
        for name in named_after(&code, "crate::") {
            if !top.is_empty() {
                edge(top.clone(), name);
            }
        }
        if module.len() >= 2 {
            let dir = module[..module.len() - 1].join("::");
            for name in named_after(&code, "super::") {
                if name.chars().next().is_some_and(char::is_lowercase) {
                    edge(format!("{dir}::{}", module[module.len() - 1]), format!("{dir}::{name}"));
                }
            }
        }
    }
    // Only edges between modules that exist (not `crate::SomeType`).
    let mut cycles = Vec::new();
    for (krate, graph) in &graphs {
        let known: BTreeSet<String> = graph.keys().cloned().collect();
        let pruned: BTreeMap<String, BTreeSet<String>> = graph
            .iter()
            .map(|(k, v)| (k.clone(), v.iter().filter(|m| known.contains(*m)).cloned().collect()))
            .collect();
        if let Some(c) = cycle(&pruned) {
            cycles.push(format!("{krate}: {}", c.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "module cycles: {cycles:?}");
    assert!(graphs.len() >= 6, "expected the six crates' modules, found {:?}", graphs.keys());
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let g = |edges: &[(&str, &str)]| {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            m.entry(a.to_string()).or_default().insert(b.to_string());
            m.entry(b.to_string()).or_default();
        }
        m
    };
    assert_eq!(cycle(&g(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(
        cycle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(module_of("crates/aqgate-core/src/engine/mod.rs"), Some(("aqgate-core".into(), vec!["engine".into()])));
    // Grouped imports name their modules too: the shape of a cycle that once hid in one
    // (gateway naming `lease` in a group, lease naming `gateway::Board`).
    assert_eq!(
        named_after(
            "use super::{Moved, lease, job::{Doing}, waiting};\nlet b = super::gateway::Board::new();",
            "super::"
        ),
        ["Moved", "lease", "job", "waiting", "gateway"]
    );
    let mut shape: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    shape.entry("propagate::gateway".into()).or_default().insert("propagate::lease".into());
    shape.entry("propagate::lease".into()).or_default().insert("propagate::gateway".into());
    assert!(cycle(&shape).is_some());
    assert_eq!(module_of("src/bin/aqgate-bench.rs"), None);
    let _ = Path::new("");
}

/// The lines of `text` that carry code, whitespace collapsed (no blank lines, no comments).
fn code_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .collect()
}

/// The longest run of consecutive lines that `a` and `b` share, as (length, where in `a`,
/// where in `b`), the places counted in code lines.
fn longest_shared_run(a: &[String], b: &[String]) -> (usize, usize, usize) {
    let mut best = (0, 0, 0);
    let mut prev = vec![0usize; b.len() + 1];
    for i in 1..=a.len() {
        let mut cur = vec![0usize; b.len() + 1];
        for j in 1..=b.len() {
            if a[i - 1] == b[j - 1] {
                cur[j] = prev[j - 1] + 1;
                if cur[j] > best.0 {
                    best = (cur[j], i - cur[j], j - cur[j]);
                }
            }
        }
        prev = cur;
    }
    best
}

/// The two store backends say nothing twice: what both run is written once (the store
/// crate's `*_store!` macros), so no run of more than 20 code lines of a PostgreSQL file
/// appears in a SQLite file too.
#[test]
fn the_store_backends_repeat_no_run_of_over_twenty_lines() {
    const MAX: usize = 20;
    let code = |dir: &str| -> Vec<(String, Vec<String>)> {
        tracked(&format!("crates/aqgate-store/src/{dir}/"))
            .into_iter()
            .map(|f| (f.clone(), code_lines(&read(&f))))
            .collect()
    };
    let (postgres, sqlite) = (code("postgres"), code("sqlite"));
    assert!(!postgres.is_empty() && !sqlite.is_empty(), "no backend files found");
    let mut repeated = Vec::new();
    for (pf, p) in &postgres {
        for (sf, s) in &sqlite {
            let (n, i, j) = longest_shared_run(p, s);
            if n > MAX {
                let at = format!("code lines {} and {}", i + 1, j + 1);
                repeated.push(format!("{pf} and {sf}: {n} lines alike ({at}), from `{}`", p[i]));
            }
        }
    }
    assert!(
        repeated.is_empty(),
        "write these once for both backends (runs over {MAX} lines):\n{}",
        repeated.join("\n")
    );
}

#[test]
fn the_run_measure_finds_the_longest_shared_run() {
    let lines = |t: &str| code_lines(t);
    let a = lines("fn a() {\n    x(1,  2);\n\n    // said\n    y();\n}\n");
    let b = lines("fn b() {\nx(1, 2);\ny();\n}\n");
    assert_eq!(longest_shared_run(&a, &b), (3, 1, 1));
}

/// The functions of `text` (rustfmt's layout: a body ends at the first line that is its
/// indentation and `}`), before its test module, as (name, lines).
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().take(non_test_lines(text)).collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let indent = &l[..l.len() - t.len()];
        let rest = ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe "]
            .iter()
            .fold(t, |r, p| r.strip_prefix(p).unwrap_or(r))
            .trim_start_matches("async ");
        let Some(name) = rest.strip_prefix("fn ") else { continue };
        if l.trim_end().ends_with(';') || l.trim_end().ends_with('}') {
            // A declaration, or a function on one line.
            continue;
        }
        let name: String = name.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let close = format!("{indent}}}");
        if let Some(end) = lines[i + 1..].iter().position(|x| *x == close) {
            out.push((name, end + 2));
        }
    }
    out
}

/// No function grows past 150 lines: those that have (named with their length when the
/// rule came) may only shrink, and leave the list once under it. The list is empty now;
/// it stays for a function that cannot be split at once, named with its length.
#[test]
fn no_function_is_over_150_lines_but_a_shrinking_few() {
    const MAX: usize = 150;
    let allowed: BTreeMap<(&str, &str), usize> = [].into_iter().collect();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for f in tracked("*.rs").into_iter().filter(|f| !f.starts_with("tests/") && !f.ends_with("tests.rs")) {
        for (name, n) in function_lengths(&read(&f)) {
            match allowed.get(&(f.as_str(), name.as_str())) {
                Some(&cap) if n > cap => problems.push(format!("{f}: {name} grew to {n} lines (at most {cap})")),
                Some(_) if n <= MAX => problems.push(format!("{f}: {name} is {n} lines now: take it off the list")),
                Some(_) => {
                    seen.insert((f.clone(), name));
                }
                None if n > MAX => problems.push(format!("{f}: {name} is {n} lines (at most {MAX})")),
                None => {}
            }
        }
    }
    for (f, name) in allowed.keys() {
        if !seen.contains(&(f.to_string(), name.to_string())) && !problems.iter().any(|p| p.contains(name)) {
            problems.push(format!("{f}: {name} is gone: take it off the list"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_function_measure_finds_a_function_and_its_end() {
    let text = "//! x\n\nfn short() {}\n\npub(crate) async fn two(\n    a: u8,\n) {\n    body();\n}\n\nimpl X {\n    fn inner(&self) {\n        if y {\n        }\n    }\n}\n";
    let got = function_lengths(text);
    assert_eq!(got, [("two".to_string(), 5), ("inner".to_string(), 4)], "{got:?}");
}
