//! Test support for the parsers' property tests: a valid input changed by a few random edits.

/// `input` with each of `edits` applied in turn, `(op, at, item)` at position `at` modulo the
/// length: op 0 replaces the item there, 1 inserts `item`, 2 removes one, anything else cuts
/// the input short there.
pub(crate) fn mutate<T>(mut input: Vec<T>, edits: Vec<(u8, usize, T)>) -> Vec<T> {
    for (op, at, item) in edits {
        let at = if input.is_empty() { 0 } else { at % input.len() };
        match op {
            0 if !input.is_empty() => input[at] = item,
            1 => input.insert(at, item),
            2 if !input.is_empty() => {
                input.remove(at);
            }
            _ => input.truncate(at),
        }
    }
    input
}
