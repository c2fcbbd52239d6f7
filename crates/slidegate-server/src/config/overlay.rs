//! The settings given on the command line, as a document of the rules file's shape, written
//! over the file's fields ([`super::Config::load_over`]), and the errors that then name their
//! flag.

use toml::{Table, Value};

use super::ConfigError;
use super::settings::{LOCATIONS, SETTINGS, Setting, by_field};

/// The value `document` (of the rules file's shape) holds at `field` (`backend.tls_ca`).
fn at<'a>(document: &'a Table, field: &str) -> Option<&'a Value> {
    match field.split_once('.') {
        Some((table, name)) => document.get(table)?.as_table()?.get(name),
        None => document.get(field),
    }
}

/// Sets `field` (`backend.tls_ca`) of `document` (of the rules file's shape) to `value`.
pub fn put(document: &mut Table, field: &str, value: Value) {
    match field.split_once('.') {
        Some((table, name)) => {
            if let Value::Table(table) = document.entry(table).or_insert_with(|| Value::Table(Table::new())) {
                table.insert(name.to_owned(), value);
            }
        }
        None => {
            document.insert(field.to_owned(), value);
        }
    }
}

/// Whether the settings given, `flags`, set `field`.
pub(super) fn sets(flags: &Table, field: &str) -> bool {
    at(flags, field).is_some()
}

/// `flags` (a document of the file's shape) written over `document`, field by field; where
/// Redis is, one setting of three fields, replaced whole.
pub(super) fn write_over(document: &mut Table, flags: &Table) {
    if LOCATIONS.iter().any(|f| sets(flags, f)) {
        if let Some(Value::Table(backend)) = document.get_mut("backend") {
            for field in LOCATIONS {
                backend.remove(&field["backend.".len()..]);
            }
        }
    }
    for (name, value) in flags {
        match (document.get_mut(name), value) {
            (Some(Value::Table(table)), Value::Table(given)) => {
                table.extend(given.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            _ => {
                document.insert(name.clone(), value.clone());
            }
        }
    }
}

/// An error of the file read with `flags` over it (`merged`), which the file alone did not
/// have: it names the flag that set the field, or, for a field no flag sets (a table's settings
/// that do not fit together), the flags given in that table.
pub(super) fn name_flag(e: ConfigError, flags: &Table, merged: &str) -> ConfigError {
    let flag = |s: &Setting| format!("--{}", s.flag);
    match e {
        ConfigError::Invalid { field, message, .. } => {
            let setting = match by_field(&field).filter(|s| sets(flags, s.field)) {
                Some(s) => flag(s),
                None => {
                    let inside = |s: &&Setting| s.field.starts_with(&format!("{field}.")) || s.field == field;
                    let given: Vec<String> =
                        SETTINGS.iter().filter(|s| sets(flags, s.field)).filter(inside).map(flag).collect();
                    format!("{} ({field})", given.join(", "))
                }
            };
            ConfigError::Setting { setting, message }
        }
        ConfigError::Toml { line, message, .. } => {
            // A value of the wrong type: the key on that line of the merged document is a flag's.
            let key = merged.lines().nth(line.saturating_sub(1)).and_then(|l| l.split_once('=')).map(|(k, _)| k.trim());
            let given = SETTINGS.iter().filter(|s| sets(flags, s.field));
            let setting = match key.and_then(|k| given.clone().find(|s| s.field.rsplit('.').next() == Some(k))) {
                Some(s) => flag(s),
                None => "the flags".to_owned(),
            };
            ConfigError::Setting { setting, message }
        }
        e => e,
    }
}
