//! Which build of slidegate's Redis module the tests load, and proof that they loaded it.
//!
//! A test that loads an old module passes or fails for the old code. So there is one module a
//! test binary may load — the one its own profile's `cargo build -p slidegate-module` wrote —
//! and it must be fresh: built from this checkout's sources, none of them changed since (the
//! dep-info file cargo writes beside it lists them). After loading, the server must say that
//! this very file is the module it runs.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::RedisServer;

/// The module's name as it registers with Redis (`MODULE LIST`).
const MODULE_NAME: &str = "slidegate";

/// The module (`crates/slidegate-module`) this test binary loads:
/// `<target>/<profile>/libslidegate_module.so` of the profile the test binary was built with
/// (where both `cargo build -p slidegate-module` and `cargo test -p slidegate-module` leave
/// it; `cargo test` alone leaves it in `deps/`). `scripts/test.sh` builds it first; a
/// `cargo test` of your own needs `cargo build -p slidegate-module` (with the same profile) first.
///
/// # Panics
/// When the module is not built, or is stale: built from another checkout, or older than one
/// of its sources.
pub fn module_path() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // Test binaries live in `<target>/<profile>/deps/`.
    let profile = exe.parent().and_then(Path::parent).expect("a profile directory");
    let stem = format!("{}slidegate_module", std::env::consts::DLL_PREFIX);
    let path = profile.join(format!("{stem}{}", std::env::consts::DLL_SUFFIX));
    let rebuild = "run `cargo build -p slidegate-module`";
    let built = modified(&path).unwrap_or_else(|| panic!("{} is not built: {rebuild}", path.display()));
    let sources = dep_info_sources(&profile.join(format!("{stem}.d")));
    let own = module_source();
    assert!(sources.contains(&own), "{} was not built from {}: {rebuild}", path.display(), own.display());
    if let Some(newer) = sources.iter().find(|s| modified(s).is_none_or(|m| m > built)) {
        panic!("{} is older than {}: {rebuild}", path.display(), newer.display());
    }
    path
}

/// Panics unless `server` runs the module from [`module_path`](fn@module_path) (`MODULE LIST`).
pub(crate) fn assert_loaded(server: &RedisServer, path: &Path) {
    let modules: Vec<redis::Value> = server.query(&["MODULE", "LIST"]);
    let loaded_from = modules.iter().find_map(|module| {
        let fields = field_map(module);
        (fields.iter().any(|(k, v)| k == "name" && v == MODULE_NAME))
            .then(|| fields.into_iter().find(|(k, _)| k == "path").map(|(_, v)| PathBuf::from(v)))
            .flatten()
    });
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_owned());
    assert_eq!(
        loaded_from.as_deref().map(canonical),
        Some(canonical(path)),
        "the server runs a slidegate module other than {}: {modules:?}",
        path.display()
    );
}

/// One `MODULE LIST` entry as (field, value) pairs of its text fields.
fn field_map(module: &redis::Value) -> Vec<(String, String)> {
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let items: Vec<&redis::Value> = match module {
        redis::Value::Array(items) => items.iter().collect(),
        redis::Value::Map(pairs) => pairs.iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => Vec::new(),
    };
    items.chunks(2).filter_map(|pair| Some((text(pair.first()?)?, text(pair.get(1)?)?))).collect()
}

/// This checkout's module source, which a module built from it lists among its dependencies.
fn module_source() -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../slidegate-module/src/lib.rs");
    source.canonicalize().unwrap_or(source)
}

/// The source files a cargo dep-info file (`target: dep dep ...`, spaces escaped as `\ `) lists.
fn dep_info_sources(file: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("{}: {e}: run `cargo build -p slidegate-module`", file.display()));
    let mut sources = Vec::new();
    for line in text.lines() {
        let Some((_, deps)) = line.split_once(": ") else { continue };
        let deps = deps.replace("\\ ", "\u{0}");
        sources.extend(deps.split_whitespace().map(|d| PathBuf::from(d.replace('\u{0}', " "))));
    }
    sources.sort();
    sources.dedup();
    sources
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
