//! The error of an operation on tensors (kernels and op rules). Every variant names the operation
//! and what it expected versus what it found, so a message alone locates the mistake; the engine
//! (tape, session, graph) wraps it in an error of its own. Shapes in errors are boxed: an error is
//! rare, a `Result` is moved on every op, and it is as large as its error.

use crate::Shape;

/// Result alias of the tensor crate and the op rules.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything an operation on tensors can reject.
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
}

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(op: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid {
            op,
            message: message.into(),
        }
    }
}
