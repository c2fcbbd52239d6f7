//! The rule of arrows of `docs/architecture.md`, read from the sources: each top-level module's
//! `crate::` paths make the module graph, which must follow the layers (a module imports only
//! its own layer and those below; the surfaces not even each other) and have no circle; and no
//! source file has more than [`MAX_CODE_LINES`] lines before its tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first, as `docs/architecture.md`'s table lists them: a name, whether its
/// modules must not import each other, and its modules.
const LAYERS: &[(&str, bool, &[&str])] = &[
    (
        "base",
        false,
        &[
            "admin",
            "api_error",
            "file",
            "inline",
            "log_buckets",
            "logging",
            "metrics",
            "mutate",
            "openapi",
            "redact",
            "request_id",
            "trace",
        ],
    ),
    ("configuration", false, &["config"]),
    ("models", false, &["backend", "envoy", "overrides", "shared_store", "stats"]),
    ("running state", false, &["app"]),
    ("changes", false, &["override_changes", "shared_rules", "watch", "write_back"]),
    ("listeners", false, &["http", "grpc", "tls"]),
    ("surfaces", true, &["api", "envoy_rls", "forward_auth", "health", "ui"]),
    ("composition root", false, &["routes", "server", "validate"]),
    ("load generator", false, &["bench"]),
];

/// The most lines of a source file before its first `#[cfg(test)]`: past it, a file does
/// more than one job.
const MAX_CODE_LINES: usize = 500;

/// Each top-level module and the top-level modules it imports.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`envoy/config.rs`: `envoy`); `None` for the
/// crate roots.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// The text without its comments (doc comments included: a link is not an import).
fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        // A `//` inside a string (a URL) cuts the line early, which only hides that line's
        // rest: a path of the crate is not written after a URL on one line.
        out.push_str(line.split("//").next().unwrap_or(""));
        out.push('\n');
    }
    out
}

/// The top-level modules `text` names after `crate::`: `crate::a::b`, and each first segment of
/// a group, `crate::{a::b, c}`.
fn imported(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `slidegate_crate::`, not this crate
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut segment = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(first_segment(&segment));
                        segment.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    segment.push(c);
                }
            }
            found.insert(first_segment(&segment));
        } else {
            found.insert(first_segment(rest));
        }
    }
    found.remove("");
    found.remove("self");
    found
}

fn first_segment(path: &str) -> String {
    path.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// Each top-level module and the modules it imports; and each file's lines before its tests.
fn read_crate() -> (Graph, Vec<(String, usize)>) {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let mut graph = Graph::new();
    let mut lengths = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src()).expect("under src/").to_owned();
        let text = std::fs::read_to_string(&file).expect("a source file");
        let name = relative.to_str().expect("a UTF-8 path").replace('\\', "/");
        lengths.push((name, text.lines().take_while(|l| !l.starts_with("#[cfg(test)]")).count()));
        let Some(module) = module_of(&relative) else { continue };
        let imports = graph.entry(module.clone()).or_default();
        imports.extend(imported(&without_comments(&text)).into_iter().filter(|m| *m != module));
    }
    (graph, lengths)
}

fn layer_of(module: &str) -> Option<(usize, bool)> {
    LAYERS.iter().position(|(_, _, modules)| modules.contains(&module)).map(|i| (i, LAYERS[i].1))
}

/// The arrows that break the rule of layers.
fn upward(graph: &Graph) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (from, imports) in graph {
        let (a, apart) = layer_of(from).unwrap_or_else(|| panic!("module {from} is in no layer of LAYERS"));
        for to in imports {
            let (b, _) = layer_of(to).unwrap_or_else(|| panic!("module {to} is in no layer of LAYERS"));
            if b > a || (b == a && apart) {
                out.insert((from.clone(), to.clone()));
            }
        }
    }
    out
}

/// A circle of `graph`, when it has one.
fn circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(node: &str, graph: &Graph, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn every_module_imports_only_its_layer_and_those_below() {
    let (graph, _) = read_crate();
    let upward = upward(&graph);
    assert!(upward.is_empty(), "imports against the layers of docs/architecture.md: {upward:?}");
}

#[test]
fn the_module_graph_has_no_circle() {
    let (graph, _) = read_crate();
    assert_eq!(circle(&graph), None, "a circle of modules");
}

#[test]
fn every_module_is_in_a_layer_and_the_table_is_the_docs() {
    let (graph, _) = read_crate();
    let listed: BTreeSet<&str> = LAYERS.iter().flat_map(|(_, _, m)| m.iter().copied()).collect();
    let modules: BTreeSet<&str> = graph.keys().map(String::as_str).collect();
    assert_eq!(listed, modules, "LAYERS lists exactly the crate's top-level modules");
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md"))
        .expect("docs/architecture.md");
    let table: Vec<(String, Vec<String>)> = doc
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let layer = cells.get(1)?.strip_prefix(|c: char| c.is_ascii_digit())?.trim().to_owned();
            let modules = cells.get(2)?.split('`').skip(1).step_by(2).map(str::to_owned).collect();
            Some((layer, modules))
        })
        .collect();
    let ours: Vec<(String, Vec<String>)> = LAYERS
        .iter()
        .map(|(name, _, modules)| ((*name).to_owned(), modules.iter().map(|m| (*m).to_owned()).collect()))
        .collect();
    assert_eq!(table, ours, "docs/architecture.md's table of layers is LAYERS");
}

#[test]
fn no_source_file_is_longer_than_the_bound_before_its_tests() {
    let (_, lengths) = read_crate();
    let long: BTreeSet<&str> =
        lengths.iter().filter(|(_, n)| *n > MAX_CODE_LINES).map(|(name, _)| name.as_str()).collect();
    assert!(long.is_empty(), "files over {MAX_CODE_LINES} lines before their tests: {long:?}");
}

#[test]
fn the_reader_finds_what_each_form_of_path_imports() {
    let text = "use crate::a::B;\nuse crate::{b::{C, D}, c, self};\nfn f() { crate::d::e(); x_crate::f(); }";
    let found: Vec<String> = imported(text).into_iter().collect();
    assert_eq!(found, ["a", "b", "c", "d"]);
    let graph: BTreeMap<String, BTreeSet<String>> =
        [("a", "b"), ("b", "c"), ("c", "a")].iter().map(|(x, y)| ((*x).into(), [(*y).into()].into())).collect();
    assert_eq!(circle(&graph), Some(["a", "b", "c", "a"].map(String::from).to_vec()));
}
