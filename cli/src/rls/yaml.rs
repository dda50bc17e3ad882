//! A YAML document as a tree whose every node knows its line and column,
//! built from yaml-rust2's events, so that a value the configuration
//! refuses is named where it was written.
//!
//! Scalars keep the text as written: envoyproxy/ratelimit reads its files
//! with Go's yaml.v2 into typed fields, and a field of type string takes
//! any plain scalar's text (`value: 123` is the value `"123"`), so the
//! type of a scalar is decided by the field that reads it, not here.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A place in a file: 1-based line and column (the column in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    /// The line, from 1.
    pub line: u32,
    /// The column, from 1, in characters.
    pub column: u32,
}

impl Position {
    fn of(marker: Marker) -> Self {
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Self {
            line: clamp(marker.line()),
            column: clamp(marker.col()).saturating_add(1),
        }
    }
}

/// A node of the document.
#[derive(Clone, Debug)]
pub enum Node {
    /// A scalar: its text as written (escapes resolved) and whether it was
    /// quoted or a block (`|`, `>`), which makes it a string whatever it
    /// reads as.
    Scalar {
        /// The text.
        text: String,
        /// Plain (unquoted, not a block scalar).
        plain: bool,
        /// Where it starts.
        at: Position,
    },
    /// A sequence.
    List {
        /// The items, in order.
        items: Vec<Node>,
        /// Where it starts.
        at: Position,
    },
    /// A mapping, its pairs in the order written.
    Map {
        /// The pairs.
        pairs: Vec<(Node, Node)>,
        /// Where it starts.
        at: Position,
    },
}

impl Node {
    /// Where the node starts.
    pub fn at(&self) -> Position {
        match self {
            Node::Scalar { at, .. } | Node::List { at, .. } | Node::Map { at, .. } => *at,
        }
    }

    /// Whether the node is YAML's null (an empty plain scalar, `~` or
    /// `null`): a field given as null is a field not given, as yaml.v2
    /// reads it.
    pub fn is_null(&self) -> bool {
        matches!(self, Node::Scalar { text, plain: true, .. }
            if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// What the node is, for an error: "a list", "a mapping", "text".
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Scalar { .. } => "a scalar",
            Node::List { .. } => "a list",
            Node::Map { .. } => "a mapping",
        }
    }
}

/// What the document could not be: its parser's message and where.
#[derive(Debug)]
pub enum YamlError {
    /// Not YAML: the parser's message.
    Syntax(String, Position),
    /// More than one document (`---`): a file holds one domain.
    SeveralDocuments(Position),
    /// Aliases that repeat their anchors into more than [`MAX_NODES`]
    /// nodes (a "billion laughs" file): where the alias that passed it is.
    TooLarge(Position),
    /// Collections nested deeper than [`MAX_DEPTH`]: where the one too
    /// deep starts.
    TooDeep(Position),
}

/// The deepest a document's collections may nest: a descriptor takes two
/// levels (its list and its mapping), so this is 127 levels of
/// descriptors, while each level of nesting costs the reading and the
/// matching stack frames. (The parser bounds flow collections, `[[[…`,
/// at about the same depth with its own message.)
pub const MAX_DEPTH: usize = 256;

/// The most nodes a document may expand to through its aliases: a
/// configuration of a million nodes is far past any real one, and the
/// bound keeps a file of nested aliases from taking the memory.
pub const MAX_NODES: usize = 1_000_000;

/// The file's one document, or `None` for a file with none (empty, or
/// comments only).
pub fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    // The parser's own `load` recurses once per level of nesting, which
    // overflows a thread's stack at a few hundred levels (700 to 1,000 on
    // a 2 MiB thread in a debug build): its events are pulled here one at
    // a time instead, and the builder stops at MAX_DEPTH. The loop ends at
    // the stream's end, which the parser always reaches or fails before.
    loop {
        let (event, marker) = parser.next_token().map_err(|error| {
            let message = error.info().to_owned();
            YamlError::Syntax(message, Position::of(*error.marker()))
        })?;
        if event == Event::StreamEnd {
            break;
        }
        builder.on_event(event, marker);
        if let Some(error) = builder.refused.take() {
            return Err(error);
        }
        if let Some(at) = builder.second_document {
            return Err(YamlError::SeveralDocuments(at));
        }
    }
    Ok(builder.document)
}

/// Builds the tree from the parser's events.
#[derive(Default)]
struct Builder {
    /// The collections being read, innermost last, each with the key read
    /// last when it is a mapping waiting for that key's value.
    open: Vec<Open>,
    /// Nodes with an anchor, by the parser's anchor id, for aliases, and
    /// how many nodes each holds.
    anchors: HashMap<usize, (Node, usize)>,
    /// Nodes built so far, aliases counted by what they repeat.
    nodes: usize,
    /// The alias that took `nodes` past [`MAX_NODES`], or the collection
    /// past [`MAX_DEPTH`]; nothing is built after it.
    refused: Option<YamlError>,
    /// The first document's root.
    document: Option<Node>,
    /// How many documents have started.
    documents: usize,
    /// Where a second document starts, if one does.
    second_document: Option<Position>,
}

struct Open {
    node: Node,
    anchor: usize,
    key: Option<Node>,
}

impl Builder {
    /// A finished node goes into the collection open around it, or is the
    /// document.
    fn place(&mut self, node: Node, anchor: usize) {
        if anchor != 0 {
            let size = size(&node);
            self.anchors.insert(anchor, (node.clone(), size));
        }
        let Some(open) = self.open.last_mut() else {
            if self.documents == 1 {
                self.document = Some(node);
            }
            return;
        };
        match &mut open.node {
            Node::List { items, .. } => items.push(node),
            Node::Map { pairs, .. } => match open.key.take() {
                Some(key) => pairs.push((key, node)),
                None => open.key = Some(node),
            },
            Node::Scalar { .. } => unreachable!("only collections are opened"),
        }
    }

    fn open(&mut self, node: Node, anchor: usize) {
        if self.open.len() == MAX_DEPTH {
            self.refused = Some(YamlError::TooDeep(node.at()));
            return;
        }
        self.open.push(Open {
            node,
            anchor,
            key: None,
        });
    }

    fn close(&mut self) {
        if let Some(mut open) = self.open.pop() {
            // The parser marks a block mapping's start at its first key's
            // `:`; the key itself is where a reader looks.
            if let Node::Map { pairs, at } = &mut open.node {
                if let Some((key, _)) = pairs.first() {
                    *at = key.at();
                }
            }
            self.place(open.node, open.anchor);
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, marker: Marker) {
        let at = Position::of(marker);
        if self.refused.is_some() {
            return;
        }
        self.nodes += 1;
        match event {
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents == 2 {
                    self.second_document = Some(at);
                }
            }
            Event::Scalar(text, style, anchor, _tag) => {
                let plain = style == TScalarStyle::Plain;
                self.place(Node::Scalar { text, plain, at }, anchor);
            }
            Event::SequenceStart(anchor, _tag) => self.open(
                Node::List {
                    items: Vec::new(),
                    at,
                },
                anchor,
            ),
            Event::MappingStart(anchor, _tag) => self.open(
                Node::Map {
                    pairs: Vec::new(),
                    at,
                },
                anchor,
            ),
            Event::SequenceEnd | Event::MappingEnd => self.close(),
            Event::Alias(id) => {
                // The parser refuses an alias to an unknown anchor, so the
                // node is there; an alias takes the anchored node's place.
                if let Some((node, size)) = self.anchors.get(&id) {
                    self.nodes = self.nodes.saturating_add(*size);
                    if self.nodes > MAX_NODES {
                        self.refused = Some(YamlError::TooLarge(at));
                        return;
                    }
                    let node = node.clone();
                    self.place(node, 0);
                }
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
        }
    }
}

/// How many nodes `node` holds, itself included.
fn size(node: &Node) -> usize {
    match node {
        Node::Scalar { .. } => 1,
        Node::List { items, .. } => items.iter().map(size).fold(1, usize::saturating_add),
        Node::Map { pairs, .. } => pairs
            .iter()
            .map(|(key, value)| size(key).saturating_add(size(value)))
            .fold(1, usize::saturating_add),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(node: &Node) -> (&str, bool, Position) {
        match node {
            Node::Scalar { text, plain, at } => (text, *plain, *at),
            other => panic!("not a scalar: {other:?}"),
        }
    }

    #[test]
    fn nodes_carry_their_line_and_column() {
        let text = "domain: d\ndescriptors:\n  - key: k\n    value: \"v\"\n";
        let Some(Node::Map { pairs, at }) = parse(text).unwrap() else {
            panic!("not a mapping")
        };
        assert_eq!(at, Position { line: 1, column: 1 });
        assert_eq!(
            scalar(&pairs[0].1),
            ("d", true, Position { line: 1, column: 9 })
        );
        let Node::List { items, at } = &pairs[1].1 else {
            panic!("not a list")
        };
        assert_eq!(*at, Position { line: 3, column: 3 });
        let Node::Map { pairs, at } = &items[0] else {
            panic!("not a mapping")
        };
        assert_eq!(*at, Position { line: 3, column: 5 });
        assert_eq!(
            scalar(&pairs[1].0),
            ("value", true, Position { line: 4, column: 5 })
        );
        assert_eq!(
            scalar(&pairs[1].1),
            (
                "v",
                false,
                Position {
                    line: 4,
                    column: 12
                }
            )
        );
    }

    #[test]
    fn aliases_repeat_their_anchor_and_empty_files_have_no_document() {
        let text = "a: &x {k: v}\nb: *x\n";
        let Some(Node::Map { pairs, .. }) = parse(text).unwrap() else {
            panic!("not a mapping")
        };
        let Node::Map { pairs: b, .. } = &pairs[1].1 else {
            panic!("the alias is not the mapping")
        };
        assert_eq!(scalar(&b[0].1).0, "v");
        assert!(parse("").unwrap().is_none());
        assert!(parse("# only a comment\n").unwrap().is_none());
    }

    #[test]
    fn syntax_errors_and_second_documents_say_where() {
        match parse("a: [b\n") {
            Err(YamlError::Syntax(_, at)) => assert_eq!(at.line, 2),
            other => panic!("{other:?}"),
        }
        match parse("a: b\n---\nc: d\n") {
            Err(YamlError::SeveralDocuments(at)) => assert_eq!(at.line, 2),
            other => panic!("{other:?}"),
        }
        // Nine levels of ten aliases each: 10^9 nodes, refused at the
        // alias that passes a million, on the sixth level (10^6 nodes).
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..9 {
            let previous = format!("*a{}", level - 1);
            let list = [previous.as_str(); 10].join(", ");
            bomb.push_str(&format!("a{level}: &a{level} [{list}]\n"));
        }
        match parse(&bomb) {
            Err(YamlError::TooLarge(at)) => assert_eq!(at.line, 6),
            other => panic!("{other:?}"),
        }
        // Deeper than the parser's own recursive loading survives.
        let deep = format!("{}x\n", "- ".repeat(100_000));
        match parse(&deep) {
            Err(YamlError::TooDeep(at)) => assert_eq!((at.line, at.column), (1, 513)),
            other => panic!("{other:?}"),
        }
    }
}
