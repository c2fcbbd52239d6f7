//! Where a refused node of an Envoy file is written. serde_yaml_ng, which reads the file,
//! keeps no positions; so a problem names its node by its place in the tree (keys and list
//! indexes from the root), and only when a file is refused is the text parsed a second time,
//! by saphyr's event parser, to find that place's line and column. The second parse never
//! expands an alias (an alias is one event), so it costs no more than the text's length.

use saphyr_parser::{Event, Parser, Span};

/// A line and column of a file, both from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The line.
    pub line: usize,
    /// The column, in characters.
    pub column: usize,
}

/// One step from a node to one inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// The entry of a map with this key (its text).
    Key(String),
    /// The item of a list at this index.
    Index(usize),
}

/// What a problem is about.
#[derive(Debug)]
pub(super) enum Place {
    /// A node, by its steps from the root.
    Node(Vec<Step>),
    /// A place in the text (a syntax error), when the parser says where.
    Text(Option<Position>),
}

/// Why a file is refused, and what about.
#[derive(Debug)]
pub(super) struct Problem {
    pub(super) message: String,
    pub(super) place: Place,
}

impl Problem {
    /// `message` about the node at `steps`.
    pub(super) fn at(steps: Vec<Step>, message: impl Into<String>) -> Self {
        Self { message: message.into(), place: Place::Node(steps) }
    }

    /// Where the problem is in `text`.
    pub(super) fn position(&self, text: &str) -> Option<Position> {
        match &self.place {
            Place::Node(steps) => locate(text, steps),
            Place::Text(position) => *position,
        }
    }
}

/// `steps` with `more` after them.
pub(super) fn join(steps: &[Step], more: &[&str]) -> Vec<Step> {
    steps.iter().cloned().chain(more.iter().map(|k| Step::Key((*k).to_owned()))).collect()
}

/// Where the node at `steps` is written in `text`: a map entry's key, a list item's start, the
/// document's root for no steps; where the steps go on past what is written (an absent key, an
/// alias), the last node reached. `None` when the text does not parse up to there (the file
/// was read by serde_yaml_ng first, so it does parse unless the two parsers disagree).
fn locate(text: &str, steps: &[Step]) -> Option<Position> {
    let mut events = Parser::new_from_str(text).map(|e| e.ok());
    let mut node = loop {
        match events.next()?? {
            (Event::StreamStart | Event::DocumentStart(_), _) => {}
            root => break root,
        }
    };
    let mut found = position(&node.1);
    for step in steps {
        let next = match (step, &node.0) {
            (Step::Key(key), Event::MappingStart(..)) => entry(&mut events, key)?,
            (Step::Index(index), Event::SequenceStart(..)) => item(&mut events, *index)?,
            _ => None,
        };
        let Some((at, value)) = next else { break };
        (found, node) = (at, value);
    }
    Some(found)
}

type Events<'a> = dyn Iterator<Item = Option<(Event<'a>, Span)>> + 'a;

/// In a map whose start was read: the position of `key` and its value's first event, or
/// `None` when the map has no such key.
fn entry<'a>(events: &mut Events<'a>, key: &str) -> Option<Option<(Position, (Event<'a>, Span))>> {
    loop {
        let (k, span) = events.next()??;
        match &k {
            Event::MappingEnd => return Some(None),
            Event::Scalar(text, ..) if text == key => return Some(Some((position(&span), events.next()??))),
            _ => skip(events, &k)?,
        }
        let value = events.next()??;
        skip(events, &value.0)?;
    }
}

/// In a list whose start was read: the position and first event of item `index`, or `None`
/// when the list is shorter.
fn item<'a>(events: &mut Events<'a>, index: usize) -> Option<Option<(Position, (Event<'a>, Span))>> {
    for _ in 0..index {
        let (e, _) = events.next()??;
        if matches!(e, Event::SequenceEnd) {
            return Some(None);
        }
        skip(events, &e)?;
    }
    let first = events.next()??;
    Some((!matches!(first.0, Event::SequenceEnd)).then(|| (position(&first.1), first)))
}

/// Reads the rest of the node that `first` starts.
fn skip(events: &mut Events<'_>, first: &Event<'_>) -> Option<()> {
    let mut depth = usize::from(matches!(first, Event::MappingStart(..) | Event::SequenceStart(..)));
    while depth > 0 {
        match events.next()??.0 {
            Event::MappingStart(..) | Event::SequenceStart(..) => depth += 1,
            Event::MappingEnd | Event::SequenceEnd => depth -= 1,
            _ => {}
        }
    }
    Some(())
}

fn position(span: &Span) -> Position {
    Position { line: span.start.line(), column: span.start.col() + 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str, steps: &[Step]) -> Option<(usize, usize)> {
        locate(text, steps).map(|p| (p.line, p.column))
    }

    fn key(k: &str) -> Step {
        Step::Key(k.to_owned())
    }

    #[test]
    fn a_node_is_found_in_block_and_flow_style_and_an_absent_one_at_its_parent() {
        let text = "# c\ndomain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: x, requests_per_unit: 1}\n  - &b {key: b, descriptors: [{key: c}]}\n  - *b\n";
        assert_eq!(at(text, &[]), Some((2, 1)));
        assert_eq!(at(text, &[key("domain")]), Some((2, 1)));
        assert_eq!(at(text, &[key("descriptors"), Step::Index(0)]), Some((4, 5)));
        assert_eq!(at(text, &[key("descriptors"), Step::Index(0), key("rate_limit"), key("unit")]), Some((5, 18)));
        assert_eq!(at(text, &[key("descriptors"), Step::Index(0), key("rate_limit"), key("name")]), Some((5, 5)));
        let nested = [key("descriptors"), Step::Index(1), key("descriptors"), Step::Index(0), key("key")];
        assert_eq!(at(text, &nested), Some((6, 32)));
        // Through an alias: the alias.
        assert_eq!(at(text, &[key("descriptors"), Step::Index(2), key("key")]), Some((7, 5)));
        assert_eq!(at(text, &[key("descriptors"), Step::Index(9)]), Some((3, 1)));
        assert_eq!(at("a: [\nb: 1", &[key("b")]), None, "not YAML");
    }
}
