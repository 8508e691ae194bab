//! The documentation (README.md and `docs/*.md`) against the repository: every code block
//! marked `<!-- file: PATH -->` is that file as it is (`<!-- excerpt: PATH -->`: a part of
//! it, word for word), every TOML block is so marked, every file under `examples/topology/`
//! and `examples/config/` is shown by some page; every topology under `examples/topology/`
//! applies, with the real binary, to a fresh SQLite database on its own and added to the
//! demo topology; every configuration file under `examples/config/` passes `config check`;
//! and every relative link points at a file that exists, and at a heading of it when it
//! names one.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BIN: &str = env!("CARGO_BIN_EXE_aqgate");

/// `aqgate` with none of the caller's `AQGATE_*` variables (they would change the result).
fn aqgate() -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("AQGATE_") {
            c.env_remove(k);
        }
    }
    c
}

/// README.md and every page of `docs/`, as (path relative to the root, text).
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs directory")
        .flatten()
        .map(|e| format!("docs/{}", e.file_name().to_string_lossy()))
        .filter(|n| n.ends_with(".md"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 10, "the docs pages: {docs:?}");
    names.extend(docs);
    names.into_iter().map(|n| (n.clone(), read(&n))).collect()
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// The files under `examples/<dir>/` ending in `.toml`, relative to the root, sorted.
fn example_files(dir: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("examples").join(dir))
        .unwrap_or_else(|e| panic!("examples/{dir}: {e}"))
        .flatten()
        .map(|e| format!("examples/{dir}/{}", e.file_name().to_string_lossy()))
        .filter(|f| f.ends_with(".toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "examples/{dir} holds no TOML file");
    files
}

/// A fenced code block: its language, its text (the fence's indentation taken off each
/// line), the marker on the line before it (`file` or `excerpt`, and the path), its line.
#[derive(Debug)]
struct Block {
    lang: String,
    text: String,
    marker: Option<(String, String)>,
    line: usize,
}

/// The fenced code blocks of a Markdown text.
fn blocks(md: &str) -> Vec<Block> {
    let lines: Vec<&str> = md.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if !trimmed.starts_with("```") {
            i += 1;
            continue;
        }
        let indent = lines[i].len() - trimmed.len();
        let lang = trimmed.trim_start_matches('`').trim().to_string();
        let marker = i.checked_sub(1).and_then(|p| marker(lines[p]));
        let start = i;
        let mut text = String::new();
        i += 1;
        while i < lines.len() && lines[i].trim_start() != "```" {
            let l = lines[i];
            text.push_str(l.get(indent.min(l.len() - l.trim_start().len())..).unwrap_or(""));
            text.push('\n');
            i += 1;
        }
        assert!(i < lines.len(), "a code block opened on line {} is never closed", start + 1);
        out.push(Block { lang, text, marker, line: start + 1 });
        i += 1;
    }
    out
}

/// `<!-- file: PATH -->` or `<!-- excerpt: PATH -->`.
fn marker(line: &str) -> Option<(String, String)> {
    let inner = line.trim().strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    let (kind, path) = inner.split_once(':')?;
    let kind = kind.trim();
    (kind == "file" || kind == "excerpt").then(|| (kind.to_string(), path.trim().to_string()))
}

/// What is wrong with one page's marked blocks: a block that is not its file (or not a
/// part of it), a TOML block without a marker. Returns the problems and the files shown.
fn check_blocks(page: &str, md: &str, read: &dyn Fn(&str) -> Option<String>) -> (Vec<String>, Vec<String>) {
    let (mut problems, mut shown) = (Vec::new(), Vec::new());
    for b in blocks(md) {
        let Some((kind, path)) = &b.marker else {
            if b.lang == "toml" {
                problems.push(format!("{page}:{}: a TOML block without a file or excerpt marker", b.line));
            }
            continue;
        };
        let Some(content) = read(path) else {
            problems.push(format!("{page}:{}: {path} does not exist", b.line));
            continue;
        };
        let same = if kind == "file" { content == b.text } else { content.contains(&b.text) };
        if !same {
            problems.push(format!(
                "{page}:{}: the block is not {}{path} as it is",
                b.line,
                if kind == "file" { "" } else { "a part of " }
            ));
        }
        shown.push(path.clone());
    }
    (problems, shown)
}

fn read_existing(relative: &str) -> Option<String> {
    std::fs::read_to_string(Path::new(ROOT).join(relative)).ok()
}

#[test]
fn every_marked_block_is_its_file_and_every_example_file_is_shown() {
    let (mut problems, mut shown) = (Vec::new(), Vec::new());
    for (page, md) in pages() {
        let (p, s) = check_blocks(&page, &md, &read_existing);
        problems.extend(p);
        shown.extend(s);
    }
    for file in example_files("topology").into_iter().chain(example_files("config")) {
        if !shown.contains(&file) {
            problems.push(format!("{file} is shown by no page of the documentation"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_block_check_sees_a_changed_file_a_missing_one_and_an_unmarked_topology() {
    let md = "<!-- file: a.toml -->\n```toml\nx = 1\n```\n\n  <!-- excerpt: b.toml -->\n  ```toml\n  y = 2\n  ```\n";
    let files = |content_a: &'static str| {
        move |p: &str| match p {
            "a.toml" => Some(content_a.to_string()),
            "b.toml" => Some("# b\ny = 2\nz = 3\n".to_string()),
            _ => None,
        }
    };
    let (problems, shown) = check_blocks("p.md", md, &files("x = 1\n"));
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(shown, ["a.toml", "b.toml"]);
    let (problems, _) = check_blocks("p.md", md, &files("x = 2\n"));
    assert!(problems.len() == 1 && problems[0].contains("a.toml"), "{problems:?}");
    let (problems, _) = check_blocks("p.md", &md.replace("b.toml", "c.toml"), &files("x = 1\n"));
    assert!(problems.len() == 1 && problems[0].contains("c.toml does not exist"), "{problems:?}");
    let (problems, _) = check_blocks("p.md", "```toml\nx = 1\n```\n", &files("x = 1\n"));
    assert!(problems.len() == 1 && problems[0].contains("without a file or excerpt marker"), "{problems:?}");
}

/// `aqgate admin apply FILE` to a fresh SQLite database: its success and output.
fn apply(file: &Path) -> (bool, String) {
    let url = common::fresh_sqlite_url();
    let out = aqgate()
        .args(["admin", "apply"])
        .arg(file)
        .args(["--database", &url])
        .output()
        .expect("run aqgate admin apply");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_file(url.trim_start_matches("sqlite://"));
    (out.status.success(), text)
}

#[test]
fn every_example_topology_applies_on_its_own_and_with_the_demo_topology() {
    let dir = std::env::temp_dir().join(format!("aqgate-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let demo = read("config/topology.toml");
    let mut problems = Vec::new();
    for file in example_files("topology") {
        let (ok, out) = apply(&Path::new(ROOT).join(&file));
        // Each file adds something of its own (queues, or an agent) and is applied.
        if !ok || !out.lines().any(|l| l.starts_with("+ queue") || l.starts_with("+ agent")) {
            problems.push(format!("{file} on its own:\n{out}"));
        }
        let both = dir.join(Path::new(&file).file_name().expect("a file name"));
        std::fs::write(&both, format!("{demo}\n{}", read(&file))).expect("write the combined topology");
        let (ok, out) = apply(&both);
        if !ok {
            problems.push(format!("{file} with config/topology.toml:\n{out}"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// The check above can fail: a topology that names an undeclared queue table, and one that
/// declares a demo queue again, are refused.
#[test]
fn a_topology_that_names_an_undeclared_queue_is_refused() {
    let dir = std::env::temp_dir().join(format!("aqgate-docs-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let undeclared = dir.join("undeclared.toml");
    std::fs::write(&undeclared, "[[queues]]\nname = \"AQUSER.X\"\nqueue_table = \"AQUSER.NOPE\"\n").expect("write");
    let (ok, out) = apply(&undeclared);
    assert!(!ok && out.contains("unknown queue table AQUSER.NOPE"), "{out}");
    let twice = dir.join("twice.toml");
    let again = "[[queues]]\nname = \"AQUSER.RAW_QUE\"\nqueue_table = \"AQUSER.RAW_TAB\"\n";
    std::fs::write(&twice, format!("{}\n{again}", read("config/topology.toml"))).expect("write");
    let (ok, out) = apply(&twice);
    assert!(!ok && out.contains("defined twice"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// IdP metadata for `config check`: the demo CA's certificate as the signing key.
fn idp_metadata(dir: &Path) -> PathBuf {
    let pem = read("certs/ca.pem");
    let der: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let xml = format!(
        "<?xml version=\"1.0\"?>\n<md:EntityDescriptor xmlns:md=\"urn:oasis:names:tc:SAML:2.0:metadata\" \
         entityID=\"https://idp.example.com/saml\"><md:IDPSSODescriptor \
         protocolSupportEnumeration=\"urn:oasis:names:tc:SAML:2.0:protocol\"><md:KeyDescriptor use=\"signing\">\
         <ds:KeyInfo xmlns:ds=\"http://www.w3.org/2000/09/xmldsig#\"><ds:X509Data><ds:X509Certificate>{der}\
         </ds:X509Certificate></ds:X509Data></ds:KeyInfo></md:KeyDescriptor></md:IDPSSODescriptor></md:EntityDescriptor>\n"
    );
    let path = dir.join("idp-metadata.xml");
    std::fs::write(&path, xml).expect("write the metadata");
    path
}

/// Every configuration file passes `config check` (the SAML one with a metadata file of
/// its own where it names `/etc/aqgate/idp-metadata.xml`; a build without SAML refuses it,
/// naming the feature).
#[test]
fn every_example_configuration_file_passes_config_check() {
    let dir = std::env::temp_dir().join(format!("aqgate-docs-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let metadata = idp_metadata(&dir);
    let mut problems = Vec::new();
    for file in example_files("config") {
        let text = read(&file);
        let saml = text.contains("[saml]");
        let copy = dir.join(Path::new(&file).file_name().expect("a file name"));
        let metadata = metadata.to_str().expect("UTF-8 path");
        std::fs::write(&copy, text.replace("/etc/aqgate/idp-metadata.xml", metadata)).expect("write the copy");
        let out = aqgate().arg("--config").arg(&copy).args(["config", "check"]).output().expect("run config check");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let refused_for_want_of_saml = !out.status.success() && err.contains("saml");
        let as_expected = if saml && !cfg!(feature = "saml") { refused_for_want_of_saml } else { out.status.success() };
        if !as_expected {
            problems.push(format!("{file}: {err}"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings (outside code blocks).
fn anchors(md: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of the inline links `[text](target)` of a Markdown text, outside code
/// blocks and code spans.
fn links(md: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

/// What is wrong with one page's relative links (`page` relative to the root).
fn check_links(page: &str, md: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let base = Path::new(page).parent().unwrap_or(Path::new(""));
    let mut problems = Vec::new();
    for target in links(md) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = target.split_once('#').map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
        let file = if path.is_empty() { page.to_string() } else { normalise(&base.join(path)) };
        let exists = Path::new(ROOT).join(&file).exists() || read(&file).is_some();
        if !exists {
            problems.push(format!("{page}: {target}: no file {file}"));
            continue;
        }
        if let Some(anchor) = anchor {
            let text = read(&file).unwrap_or_default();
            if !anchors(&text).iter().any(|a| a == anchor) {
                problems.push(format!("{page}: {target}: {file} has no heading #{anchor}"));
            }
        }
    }
    problems
}

/// `docs/../README.md` → `README.md`.
fn normalise(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            other => parts.push(other.as_os_str().to_string_lossy().to_string()),
        }
    }
    parts.join("/")
}

#[test]
fn every_relative_link_points_at_an_existing_file_and_heading() {
    let mut problems = Vec::new();
    for (page, md) in pages() {
        problems.extend(check_links(&page, &md, &read_existing));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_link_check_sees_a_missing_file_and_a_missing_heading() {
    let pages = |p: &str| match p {
        "docs/a.md" => Some("# A\n\n## Sessions, restarts and retries\n".to_string()),
        "docs/b.md" => Some("[ok](a.md#sessions-restarts-and-retries) [self](#b)\n\n# B\n".to_string()),
        _ => None,
    };
    let ok = "[a](a.md#sessions-restarts-and-retries) [b](b.md) [up](../README.md) [web](https://example.com) `[x](nope.md)`";
    assert!(check_links("docs/c.md", ok, &pages).is_empty(), "{:?}", check_links("docs/c.md", ok, &pages));
    let missing = check_links("docs/c.md", "[a](nope.md)", &pages);
    assert!(missing.len() == 1 && missing[0].contains("no file docs/nope.md"), "{missing:?}");
    let heading = check_links("docs/c.md", "[a](a.md#sessions)", &pages);
    assert!(heading.len() == 1 && heading[0].contains("no heading #sessions"), "{heading:?}");
    assert_eq!(slug("`[[types]]` — object and varray types"), "types--object-and-varray-types");
    assert_eq!(slug("SYS.ANYDATA queues"), "sysanydata-queues");
}
