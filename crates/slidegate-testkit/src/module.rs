//! Which build of slidegate's Redis module the tests load, and proof that they loaded it.
//!
//! A test that loads an old module passes or fails for the old code. So there is one module a
//! test binary may load — the one its own profile's `cargo build -p slidegate-module` wrote —
//! and it must be fresh: built from this checkout's sources, none of them changed since (the
//! dep-info file cargo writes beside it lists them). A missing or stale module is built here,
//! once per test binary (cargo's own lock on the target directory keeps two binaries from
//! building it at once), so a plain `cargo test` works as `scripts/test.sh` does. After
//! loading, the server must say that this very file is the module it runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

use crate::RedisServer;

/// The module's name as it registers with Redis (`MODULE LIST`).
const MODULE_NAME: &str = "slidegate";

/// The module (`crates/slidegate-module`) this test binary loads:
/// `<target>/<profile>/libslidegate_module.so` of the profile the test binary was built with
/// (where `cargo build -p slidegate-module` leaves it; `cargo test` alone leaves it in
/// `deps/`). Built first with that profile when missing or older than its sources.
///
/// # Panics
/// When the build fails, or what it wrote is still not a fresh build of this checkout's module.
pub fn module_path() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(build_when_stale).clone()
}

/// Where this profile's module lives, built by `cargo build -p slidegate-module` when
/// [`stale`] finds a reason.
fn build_when_stale() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // Test binaries live in `<target>/<profile>/deps/`.
    let profile = exe.parent().and_then(Path::parent).expect("a profile directory");
    let stem = format!("{}slidegate_module", std::env::consts::DLL_PREFIX);
    let path = profile.join(format!("{stem}{}", std::env::consts::DLL_SUFFIX));
    let dep_info = profile.join(format!("{stem}.d"));
    if stale(&path, &dep_info).is_some() {
        build(profile);
    }
    if let Some(reason) = stale(&path, &dep_info) {
        panic!("{reason}: run `cargo build -p slidegate-module` with the tests' profile");
    }
    path
}

/// Why `path` is not a fresh build of this checkout's module, if it is not.
fn stale(path: &Path, dep_info: &Path) -> Option<String> {
    let Some(built) = modified(path) else { return Some(format!("{} is not built", path.display())) };
    let Some(sources) = dep_info_sources(dep_info) else {
        return Some(format!("{} has no dep-info file beside it", path.display()));
    };
    let own = module_source();
    if !sources.contains(&own) {
        return Some(format!("{} was not built from {}", path.display(), own.display()));
    }
    let newer = sources.iter().find(|s| modified(s).is_none_or(|m| m > built))?;
    Some(format!("{} is older than {}", path.display(), newer.display()))
}

/// `cargo build -p slidegate-module` into `profile` (`<target>/<profile>`), with that profile.
fn build(profile: &Path) {
    let target_dir = profile.parent().expect("a target directory");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../slidegate-module/Cargo.toml");
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo.arg("build").arg("--manifest-path").arg(&manifest).arg("--target-dir").arg(target_dir);
    match profile.file_name().and_then(|p| p.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cargo.arg("--release");
        }
        Some(other) => {
            cargo.args(["--profile", other]);
        }
        None => panic!("{}: not a profile directory", profile.display()),
    }
    let status = cargo.status().unwrap_or_else(|e| panic!("running cargo to build the module: {e}"));
    assert!(status.success(), "`cargo build -p slidegate-module` failed ({status}): see its output above");
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

/// The source files a cargo dep-info file (`target: dep dep ...`, spaces escaped as `\ `) lists;
/// `None` when there is no such file.
fn dep_info_sources(file: &Path) -> Option<Vec<PathBuf>> {
    let text = std::fs::read_to_string(file).ok()?;
    let mut sources = Vec::new();
    for line in text.lines() {
        let Some((_, deps)) = line.split_once(": ") else { continue };
        let deps = deps.replace("\\ ", "\u{0}");
        sources.extend(deps.split_whitespace().map(|d| PathBuf::from(d.replace('\u{0}', " "))));
    }
    sources.sort();
    sources.dedup();
    Some(sources)
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
