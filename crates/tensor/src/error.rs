//! The one error type of tapegrad. Every variant says which operation failed and what it expected
//! versus what it found, so a message alone is enough to locate the mistake. Shapes in errors are
//! boxed: an error is rare, a `Result` is moved on every op, and it is as large as its error.

use crate::Shape;

/// Result alias used throughout tapegrad.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in tapegrad below the file and CLI layers.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Two shapes that must be equal are not.
    #[error("{op}: shape mismatch: expected {expected}, found {found}")]
    ShapeMismatch {
        op: &'static str,
        expected: Box<Shape>,
        found: Box<Shape>,
    },
    /// Two shapes do not broadcast under NumPy/PyTorch rules.
    #[error("{op}: shapes {lhs} and {rhs} do not broadcast")]
    Broadcast {
        op: &'static str,
        lhs: Box<Shape>,
        rhs: Box<Shape>,
    },
    /// A data buffer's length disagrees with the element count of its shape.
    #[error("{op}: data has {len} elements but shape {shape} needs {numel}")]
    DataLength {
        op: &'static str,
        len: usize,
        shape: Box<Shape>,
        numel: usize,
    },
    /// A shape whose element count (or its byte count) does not fit in `usize`.
    #[error("{op}: shape {dims:?} has too many elements")]
    Overflow { op: &'static str, dims: Vec<usize> },
    /// An axis outside `-rank..rank`.
    #[error("{op}: axis {axis} is out of range for a tensor of rank {rank}")]
    Axis {
        op: &'static str,
        axis: isize,
        rank: usize,
    },
    /// An index (class label, position, slice bound) outside its valid range.
    #[error("{op}: {what} {index} is out of range (bound {bound})")]
    Index {
        op: &'static str,
        what: &'static str,
        index: i64,
        bound: usize,
    },
    /// An argument or attribute that is invalid for the operation.
    #[error("{op}: {message}")]
    Invalid { op: &'static str, message: String },
    /// A value outside the operation's domain, found by checked evaluation.
    #[error("{op}: domain error at element {index}: {message}")]
    Domain {
        op: &'static str,
        index: usize,
        message: String,
    },
    /// An operation received the wrong number of arguments.
    #[error("{op}: expected {expected} arguments, found {found}")]
    Arity {
        op: &'static str,
        expected: usize,
        found: usize,
    },
    /// A node id that does not exist on the tape.
    #[error("{context}: node id {id} is out of range (the tape has {len} nodes)")]
    BadId {
        context: &'static str,
        id: usize,
        len: usize,
    },
    /// A gradient or seed whose shape differs from its node's value shape.
    #[error("{context}: node {id} ({op}) has value shape {expected} but received a gradient of shape {found}")]
    GradShape {
        context: &'static str,
        id: usize,
        op: String,
        expected: Box<Shape>,
        found: Box<Shape>,
    },
    /// A gradient array whose length differs from the number of nodes.
    #[error("{context}: expected {expected} gradient slots, found {found}")]
    GradCount {
        context: &'static str,
        expected: usize,
        found: usize,
    },
    /// A handle used after the session that made it was reset.
    #[error("stale handle: variable {id} belongs to step {handle_step}, but the session is at step {session_step} (handles do not survive reset)")]
    StaleHandle {
        id: usize,
        handle_step: u64,
        session_step: u64,
    },
    /// A value that is not finite where anomaly detection demands it be.
    #[error("{0}")]
    Anomaly(String),
    /// A graph-level error that names the node where it happened.
    #[error("node {node}: {source}")]
    AtNode {
        node: String,
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(op: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid {
            op,
            message: message.into(),
        }
    }

    /// Wraps this error with the name of the graph node it happened at.
    pub fn at_node(self, node: impl Into<String>) -> Self {
        Error::AtNode {
            node: node.into(),
            source: Box::new(self),
        }
    }
}
