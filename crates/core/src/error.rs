//! The engine's error type: an op's own error (shapes, axes, domain, arguments) passes through
//! unchanged as [`Error::Op`]; the tape, the session and the graph add what only they can get
//! wrong (node ids, gradient shapes, stale handles, anomalies, the graph node an error happened at).

use tapegrad_tensor::Shape;

/// An op's error, as the tensor crate and the op rules report it.
pub use tapegrad_tensor::Error as OpError;

/// Result alias of the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the engine (tape, session, graph, laws) can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An op rejected its arguments: the op and the shapes or values are named in it.
    #[error(transparent)]
    Op(#[from] OpError),
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
        /// The node's op or custom label (boxed as `str`: two words, not three).
        op: Box<str>,
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
    /// An op's [`OpError::Invalid`]: an argument or attribute the op cannot take.
    pub fn invalid(op: &'static str, message: impl Into<String>) -> Self {
        Error::Op(OpError::invalid(op, message))
    }

    /// Wraps this error with the name of the graph node it happened at.
    pub fn at_node(self, node: impl Into<String>) -> Self {
        Error::AtNode {
            node: node.into(),
            source: Box::new(self),
        }
    }

    /// The op's error inside this one, under any node names around it, if it is one.
    pub fn op_error(&self) -> Option<&OpError> {
        match self {
            Error::Op(e) => Some(e),
            Error::AtNode { source, .. } => source.op_error(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_stays_as_small_as_an_op_error_plus_its_tag() {
        assert!(size_of::<Error>() <= size_of::<OpError>() + 8);
    }

    #[test]
    fn an_op_error_reads_the_same_through_the_engine_and_is_found_under_node_names() {
        let op = OpError::invalid("conv2d", "stride must be positive, got 0");
        let engine = Error::from(op.clone()).at_node("'c1' (conv2d)");
        assert_eq!(
            engine.to_string(),
            "node 'c1' (conv2d): conv2d: stride must be positive, got 0"
        );
        assert_eq!(engine.op_error(), Some(&op));
        assert_eq!(Error::Anomaly("nan".into()).op_error(), None);
    }
}
