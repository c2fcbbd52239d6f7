//! Counters that are in `/metrics` only while something holds them: a rule's and an Envoy
//! domain's series, held by the configuration in force, leave the page with it on a reload or
//! a push. The Prometheus recorder keeps every series it is given for the life of the process
//! (it has no way to remove one), so these are kept here and written after its page.
//!
//! A series is keyed by its name and labels; asking for one that is still held gives the same
//! counter, so a rule that keeps its name across a reload keeps its count.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use metrics::{Counter, CounterFn};

#[derive(Debug, Default)]
struct Cell(AtomicU64);

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Relaxed);
    }
}

/// `(name, labels as written)` → the counter, while held.
type Held = BTreeMap<(&'static str, String), Weak<Cell>>;

// A std lock: taken when a configuration is built and when the page is written, never on a
// decision's path (a decision holds its counter).
static HELD: LazyLock<Mutex<Held>> = LazyLock::new(Mutex::default);

/// The counter `name{labels}`: the one already held under that key, or a new one from 0.
pub fn counter(name: &'static str, labels: &[(&'static str, String)]) -> Counter {
    let key = (name, written(labels));
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(cell) = held.get(&key).and_then(Weak::upgrade) {
        return Counter::from_arc(cell);
    }
    let cell = Arc::new(Cell::default());
    held.insert(key, Arc::downgrade(&cell));
    Counter::from_arc(cell)
}

/// The counter `name{labels}` if something holds it still.
pub fn existing(name: &'static str, labels: &[(&'static str, String)]) -> Option<Counter> {
    let held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    held.get(&(name, written(labels))).and_then(Weak::upgrade).map(Counter::from_arc)
}

/// `{label="value",…}`, or nothing without labels.
fn written(labels: &[(&'static str, String)]) -> String {
    let mut written = String::new();
    for (i, (label, value)) in labels.iter().enumerate() {
        let _ = write!(written, "{}{label}=\"{}\"", if i == 0 { "{" } else { "," }, escape(value));
    }
    if !labels.is_empty() {
        written.push('}');
    }
    written
}

/// Appends every held counter to `page`, in the Prometheus text format, and forgets those no
/// longer held.
pub fn render(page: &mut String) {
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    held.retain(|_, cell| cell.strong_count() > 0);
    let mut family = None;
    for ((name, labels), cell) in held.iter() {
        let Some(cell) = cell.upgrade() else { continue };
        if family != Some(*name) {
            if family.is_some() {
                page.push('\n');
            }
            let _ = writeln!(page, "# TYPE {name} counter");
            family = Some(*name);
        }
        let _ = writeln!(page, "{name}{labels} {}", cell.0.load(Relaxed));
    }
    if family.is_some() {
        page.push('\n');
    }
}

/// A label value as the text format writes it.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_on_the_page_while_held_and_keeps_its_count_across_holders() {
        let labels = [("rule", "held-\"test\"".to_owned())];
        let first = counter("slidegate_held_test_total", &labels);
        first.increment(2);
        let second = counter("slidegate_held_test_total", &labels);
        second.increment(1);
        let mut page = String::new();
        render(&mut page);
        assert!(page.contains("# TYPE slidegate_held_test_total counter\n"), "{page}");
        assert!(page.contains("slidegate_held_test_total{rule=\"held-\\\"test\\\"\"} 3\n"), "{page}");
        assert!(existing("slidegate_held_test_total", &labels).is_some());
        drop((first, second));
        assert!(existing("slidegate_held_test_total", &labels).is_none());
        let mut page = String::new();
        render(&mut page);
        assert!(!page.contains("slidegate_held_test_total"), "{page}");
    }
}
