//! The laws `--verify-every` checks, by their number in `docs/design.md`, and the failure a
//! check returns: which law, at which step, which node, and what differed.

/// A law of `docs/design.md` section 5 that a verification checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Law {
    /// 1: the executed sweep equals the reference sweep from the one-hot seed.
    ExecutedReference,
    /// 3: the executed sweep on a lowered tape equals graph backprop from a single seed.
    LoweredExecuted,
    /// 4: the saved graph's backward equals `backprop_all` bit for bit (and the eager step).
    SavedGraph,
    /// 5: the JVP along a direction equals the gradient's inner product with it.
    Adjoint,
    /// 6: central finite differences of the loss (in f64) equal the gradient along a direction.
    Derivative,
    /// 7: every node maps a zero cotangent to zeros.
    ZeroPreserving,
}

impl Law {
    /// Its number in `docs/design.md`.
    pub fn number(self) -> u8 {
        match self {
            Law::ExecutedReference => 1,
            Law::LoweredExecuted => 3,
            Law::SavedGraph => 4,
            Law::Adjoint => 5,
            Law::Derivative => 6,
            Law::ZeroPreserving => 7,
        }
    }

    /// A few words saying what it states.
    pub fn title(self) -> &'static str {
        match self {
            Law::ExecutedReference => "executed = reference",
            Law::LoweredExecuted => "executed on a lowered tape = graph",
            Law::SavedGraph => "saved graph = graph, bit for bit",
            Law::Adjoint => "jvp = <grad, v>",
            Law::Derivative => "finite differences = <grad, v>",
            Law::ZeroPreserving => "zero-preserving",
        }
    }
}

/// A law that did not hold: where, and what differed.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyFailure {
    pub law: Law,
    /// The training step (none outside a run).
    pub step: Option<u64>,
    /// The node the failure is traced to (op, name, what it reads), when one is.
    pub node: Option<String>,
    /// What differed.
    pub message: String,
}

impl VerifyFailure {
    pub fn new(law: Law, node: Option<String>, message: impl Into<String>) -> Self {
        VerifyFailure {
            law,
            step: None,
            node,
            message: message.into(),
        }
    }

    /// The same failure, at training step `step`.
    pub fn at_step(mut self, step: u64) -> Self {
        self.step = Some(step);
        self
    }
}

impl std::fmt::Display for VerifyFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "verify: law {} ({}) failed",
            self.law.number(),
            self.law.title()
        )?;
        if let Some(step) = self.step {
            write!(f, " at step {step}")?;
        }
        if let Some(node) = &self.node {
            write!(f, " at {node}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for VerifyFailure {}
