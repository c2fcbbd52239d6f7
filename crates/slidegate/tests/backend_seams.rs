//! A bound cannot be lost by a wrapper: `Backend` has no method with a default body (a default
//! would silently replace the bound of any wrapper that forgot to forward it), and every
//! implementor in the workspace states
//! each method. The compiler enforces the second once the first holds; this test fails the day
//! someone adds a default, with the method's name.

use std::fs;
use std::path::{Path, PathBuf};

/// The workspace's Rust sources: every crate's `src`, `tests`, `examples` and `benches`.
fn sources() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("crates/").to_path_buf();
    let mut files = Vec::new();
    let mut dirs = vec![crates];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("a readable directory").flatten() {
            let path = entry.path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != "target" && n != "fixtures") {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// `text` with comments, string and char literals blanked (their braces and semicolons are
/// not code), lengths kept.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let (skip_to, keep) = match c[i] {
            '/' if c.get(i + 1) == Some(&'/') => {
                (c[i..].iter().position(|&x| x == '\n').map_or(c.len(), |p| i + p), false)
            }
            '/' if c.get(i + 1) == Some(&'*') => (find(&c, i + 2, "*/") + 2, false),
            '"' => (string_end(&c, i + 1), false),
            '\'' if c.get(i + 1) == Some(&'\\') => {
                (c[i + 2..].iter().position(|&x| x == '\'').map_or(c.len(), |p| i + p + 3), false)
            }
            '\'' if c.get(i + 2) == Some(&'\'') => (i + 3, false),
            _ => (i + 1, true),
        };
        let skip_to = skip_to.min(c.len());
        if keep {
            out.push(c[i]);
        } else {
            out.extend(std::iter::repeat_n(' ', skip_to - i));
        }
        i = skip_to;
    }
    out
}

fn find(c: &[char], from: usize, pat: &str) -> usize {
    let p: Vec<char> = pat.chars().collect();
    (from..c.len()).find(|&i| c[i..].starts_with(&p)).unwrap_or(c.len())
}

/// The index after the closing quote of a string opened before `from`.
fn string_end(c: &[char], mut i: usize) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// The body between the brace opening at or after `at` and its match.
fn block(code: &str, at: usize) -> &str {
    let open = at + code[at..].find('{').expect("a block");
    let mut depth = 0;
    for (i, ch) in code[open..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &code[open + 1..open + i];
                }
            }
            _ => {}
        }
    }
    panic!("an unclosed block")
}

/// The names of the functions declared at the top level of `body`, each with whether it has a
/// body (`{`) rather than ending in `;`.
fn functions(body: &str) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    let mut depth = 0;
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < body.len() {
        match bytes[i] {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b'f' if depth == 0 && body[i..].starts_with("fn ") && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()) => {
                let name: String = body[i + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                let end = i + body[i..].find(['{', ';']).expect("a signature's end");
                found.push((name, bytes[end] == b'{'));
            }
            _ => {}
        }
        i += 1;
    }
    found
}

#[test]
fn no_backend_method_has_a_default_and_every_implementor_states_each() {
    let trait_file = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend.rs");
    let code = code_only(&fs::read_to_string(trait_file).expect("backend.rs"));
    let at = code.find("pub trait Backend").expect("the Backend trait");
    let methods = functions(block(&code, at));
    for method in ["check", "charge", "refund"] {
        assert!(methods.iter().any(|(m, _)| m == method), "{method} not found among {methods:?}");
    }
    let defaults: Vec<&str> = methods.iter().filter(|(_, body)| *body).map(|(m, _)| m.as_str()).collect();
    assert!(defaults.is_empty(), "Backend methods with a default body, which a wrapper loses silently: {defaults:?}");

    let mut implementors = Vec::new();
    for file in sources() {
        let code = code_only(&fs::read_to_string(&file).expect("a source file"));
        let mut from = 0;
        while let Some(found) = code[from..].find(" Backend for ") {
            let at = from + found;
            from = at + 1;
            let line_start = code[..at].rfind('\n').map_or(0, |n| n + 1);
            if !code[line_start..at].trim_start().starts_with("impl") {
                continue;
            }
            let header: String = code[at..].chars().take_while(|&c| c != '{').collect();
            let stated: Vec<String> = functions(block(&code, at)).into_iter().map(|(name, _)| name).collect();
            let missing: Vec<&str> =
                methods.iter().map(|(m, _)| m.as_str()).filter(|m| !stated.iter().any(|s| s == m)).collect();
            assert!(missing.is_empty(), "{}: impl{header} does not state {missing:?}", file.display());
            implementors.push(header.trim().to_owned());
        }
    }
    for expected in ["MemoryBackend", "RedisBackend", "AnyBackend"] {
        assert!(implementors.iter().any(|i| i.contains(expected)), "{expected} not found among {implementors:?}");
    }
}
