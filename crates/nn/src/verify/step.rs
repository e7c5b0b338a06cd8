//! The trainer's hook: `Verifier` runs the checks on every N-th step (on a replay of the step's
//! own tape, the backend's saved graph, and the loss along a seeded direction), keeps the
//! counts for the summary and each step's results for the log, and turns a failure into an
//! error unless told to warn. It reads the model and the step's output and changes neither.

use super::failure::{Law, VerifyFailure};
use super::{directional, executed_reference, saved_graph, tape_id_of, zero_preserving};
use super::{first_difference, Equality, Recorded, TapeGraph};
use crate::backend::{Backend, BackendKind, StepOutput};
use crate::data::Batch;
use crate::error::{NnError, NnResult};
use crate::grad::Grad;
use crate::layers::Mode;
use crate::model::Model;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::time::Instant;
use tapegrad_tensor::{Scalar, Tensor};

/// The stream the direction of step `step`'s check is drawn from (its own purpose, so drawing
/// it moves no stream the training uses).
pub fn direction_rng(seed: u64, step: u64) -> ChaCha8Rng {
    const VERIFY: u64 = 0x7665_7269;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ VERIFY.rotate_left(32));
    rng.set_stream(step);
    rng
}

/// One law checked on one step.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckResult {
    pub law: Law,
    /// `None` when the law held.
    pub failure: Option<VerifyFailure>,
    /// For laws 5 and 6: the relative error and the tolerance it was held to.
    pub rel_err: Option<(f64, f64)>,
}

/// Everything checked on one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepVerification {
    pub step: u64,
    pub checks: Vec<CheckResult>,
    pub seconds: f64,
}

impl StepVerification {
    /// Whether every law held.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.failure.is_none())
    }

    /// The first failure.
    pub fn failure(&self) -> Option<&VerifyFailure> {
        self.checks.iter().find_map(|c| c.failure.as_ref())
    }

    /// One JSON-lines record (`split` `"verify"`).
    pub fn to_json(&self) -> serde_json::Value {
        let checks: Vec<serde_json::Value> = self
            .checks
            .iter()
            .map(|c| {
                let mut o = serde_json::json!({
                    "law": c.law.number(),
                    "title": c.law.title(),
                    "passed": c.failure.is_none(),
                });
                if let Some((err, tol)) = c.rel_err {
                    o["rel_err"] = finite_or_null(err);
                    o["rel_tol"] = finite_or_null(tol);
                }
                if let Some(f) = &c.failure {
                    o["node"] = f.node.clone().map_or(serde_json::Value::Null, Into::into);
                    o["error"] = f.to_string().into();
                }
                o
            })
            .collect();
        serde_json::json!({
            "split": "verify",
            "step": self.step,
            "passed": self.passed(),
            "checks": checks,
            "verify_seconds": self.seconds,
        })
    }
}

fn finite_or_null(v: f64) -> serde_json::Value {
    match v.is_finite() {
        true => v.into(),
        false => serde_json::Value::Null,
    }
}

/// Totals over a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VerifyStats {
    /// Steps verified.
    pub steps: u64,
    /// Laws checked, all steps together.
    pub checks: u64,
    pub passed: u64,
    /// The largest relative error of the directional checks (laws 5 and 6).
    pub worst_rel_err: f64,
    /// Time spent verifying.
    pub seconds: f64,
}

/// What `Verifier::check` needs of a step: the model before its update, the batch, the step's
/// dropout stream (a copy of the one the step drew from) and what the backend computed.
pub struct StepCheck<'a, S: Scalar> {
    /// The step's number (1 for the first).
    pub step: u64,
    /// The run's seed (the direction's stream is derived from it).
    pub seed: u64,
    pub model: &'a Model<S>,
    pub batch: &'a Batch<S>,
    pub rng: ChaCha8Rng,
    pub label_smoothing: f64,
    pub output: &'a StepOutput<S>,
}

/// Verifies every `every`-th step.
#[derive(Debug, Clone)]
pub struct Verifier {
    every: u64,
    warn: bool,
    stats: VerifyStats,
    last: Option<StepVerification>,
}

impl Verifier {
    /// Checks every `every`-th step (positive); with `warn`, a failure is reported in the step's
    /// results and the run goes on, else it stops the run.
    pub fn new(every: u64, warn: bool) -> NnResult<Self> {
        if every == 0 {
            return Err(NnError::Config("--verify-every needs a positive N".into()));
        }
        Ok(Verifier {
            every,
            warn,
            stats: VerifyStats::default(),
            last: None,
        })
    }

    /// Whether step `step` (1 for the first) is verified.
    pub fn due(&self, step: u64) -> bool {
        step % self.every == 0
    }

    /// The totals so far.
    pub fn stats(&self) -> &VerifyStats {
        &self.stats
    }

    /// The results of the last verified step, once.
    pub fn take_last(&mut self) -> Option<StepVerification> {
        self.last.take()
    }

    /// Checks `s` if it is due: an error for the first law that failed (unless warning), or
    /// for a check that could not run.
    pub fn check<S: Scalar>(
        &mut self,
        s: StepCheck<'_, S>,
        backend: &mut dyn Backend<S>,
    ) -> NnResult<()> {
        if !self.due(s.step) {
            return Ok(());
        }
        let started = Instant::now();
        let checks = run_checks(&s, backend)?;
        let v = StepVerification {
            step: s.step,
            checks,
            seconds: started.elapsed().as_secs_f64(),
        };
        let stats = &mut self.stats;
        stats.steps += 1;
        stats.seconds += v.seconds;
        for c in &v.checks {
            stats.checks += 1;
            stats.passed += u64::from(c.failure.is_none());
            if let Some((err, _)) = c.rel_err {
                stats.worst_rel_err = stats.worst_rel_err.max(err);
            }
        }
        let failure = v.failure().cloned();
        self.last = Some(v);
        match failure {
            Some(f) if !self.warn => Err(NnError::Verify(Box::new(f))),
            _ => Ok(()),
        }
    }
}

/// Laws 7, 1, 4 (compiled backend) and 5 and 6 on step `s`.
fn run_checks<S: Scalar>(
    s: &StepCheck<'_, S>,
    backend: &mut dyn Backend<S>,
) -> NnResult<Vec<CheckResult>> {
    let at = |r: Result<(), VerifyFailure>| r.err().map(|f| f.at_step(s.step));
    let result = |law, r| CheckResult {
        law,
        failure: at(r),
        rel_err: None,
    };
    // The step's own tape: the same parameters, batch and dropout stream give the same nodes.
    let rec = Recorded::model(
        s.model,
        s.batch,
        Mode::Train,
        s.rng.clone(),
        s.label_smoothing,
    )?;
    let compiled = backend.kind() == BackendKind::Compiled;
    // The step's gradients must be the executed sweep's: law 1 for the eager backend (its step
    // is that sweep), law 4 for the compiled one (its saved graph must give an eager step's).
    let step_law = match compiled {
        true => Law::SavedGraph,
        false => Law::ExecutedReference,
    };
    let mut checks = vec![result(Law::ZeroPreserving, zero_preserving(&rec))];
    let (law1, executed) = match executed_reference(&rec) {
        Ok(e) => (Ok(()), e),
        Err(f) => (Err(f), rec.tape().backward_all(rec.loss, &rec.seed()?)?),
    };
    let same_step = same_as_step(s, &rec, &executed, step_law);
    match compiled {
        true => {
            checks.push(result(Law::ExecutedReference, law1));
            let saved = law4(s, backend, &rec, &executed)?;
            checks.push(result(Law::SavedGraph, saved.and(same_step)));
        }
        false => checks.push(result(Law::ExecutedReference, law1.and(same_step))),
    }
    let tg = TapeGraph::new(&rec)?;
    let mut rng = direction_rng(s.seed, s.step);
    let (d, verdict) = directional(&rec, &tg, &executed, &mut rng)?;
    let failure = at(verdict);
    let failed = |law| failure.clone().filter(|f| f.law == law);
    checks.push(CheckResult {
        law: Law::Adjoint,
        failure: failed(Law::Adjoint),
        rel_err: Some((d.adjoint_error(), d.tol_adjoint / d.scale)),
    });
    // Law 6 is judged only when law 5 held (a wrong gradient fails both; 5 names it).
    checks.push(CheckResult {
        law: Law::Derivative,
        failure: failed(Law::Derivative),
        rel_err: Some((d.derivative_error(), d.tol_derivative / d.scale)),
    });
    Ok(checks)
}

/// The replay is the step (same loss bits) and the step's gradients equal the executed sweep's
/// parameter slots: `==` on the eager backend (law 1), identical bits on the compiled one (law 4).
fn same_as_step<S: Scalar>(
    s: &StepCheck<'_, S>,
    rec: &Recorded<S>,
    executed: &[Tensor<S>],
    law: Law,
) -> Result<(), VerifyFailure> {
    let fail = |node, msg: String| Err(VerifyFailure::new(law, node, msg));
    let loss = rec.loss_value().unwrap_or(f64::NAN);
    if loss.to_bits() != s.output.loss.to_bits() {
        return fail(
            None,
            format!(
                "the step's loss is {:e} but its replay on a tape gives {loss:e}",
                s.output.loss
            ),
        );
    }
    let how = match law {
        Law::SavedGraph => Equality::Bits,
        _ => Equality::Values,
    };
    if s.output.grads.len() != rec.params.len() {
        return fail(
            None,
            format!(
                "the step gave {} gradients for {} parameters",
                s.output.grads.len(),
                rec.params.len()
            ),
        );
    }
    for (g, (name, id)) in s.output.grads.iter().zip(&rec.params) {
        let dense = match g {
            Grad::Dense(t) => t.clone(),
            other => match other.clone().into_dense() {
                Ok(t) => t,
                Err(e) => return fail(None, format!("parameter {name}: {e}")),
            },
        };
        let want = std::slice::from_ref(&executed[*id]);
        if let Some(d) = first_difference(std::slice::from_ref(&dense), want, None, how) {
            return fail(
                Some(rec.describe(*id)),
                format!(
                    "the step's gradient differs from the tape's executed sweep: {}",
                    d.what("the step", "the executed sweep")
                ),
            );
        }
    }
    Ok(())
}

/// Law 4 on the compiled backend's own saved graph for this batch and dropout stream, seeded
/// with the output's cotangent from the executed sweep (the loss VJP's, as the step seeds it).
fn law4<S: Scalar>(
    s: &StepCheck<'_, S>,
    backend: &mut dyn Backend<S>,
    rec: &Recorded<S>,
    executed: &[Tensor<S>],
) -> NnResult<Result<(), VerifyFailure>> {
    let Some(step_graph) = backend.step_graph(s.model, s.batch, s.rng.clone())? else {
        return Ok(Err(VerifyFailure::new(
            Law::SavedGraph,
            None,
            "the compiled backend has no saved graph for this batch",
        )));
    };
    let graph = step_graph.graph.graph();
    let out_slot = graph.last_slot()?;
    let seed = graph.single(out_slot, &executed[rec.output])?;
    let describe = |slot: usize| match graph.name(slot).ok().and_then(tape_id_of) {
        Some(id) => rec.describe(id),
        None => format!("graph slot {slot}"),
    };
    Ok(saved_graph(
        step_graph.graph,
        &step_graph.inputs,
        seed,
        describe,
    ))
}
