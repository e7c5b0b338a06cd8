//! Test-only fault injection (cargo feature `fault-injection`, enabled from dev-dependencies
//! only): plants a wrong VJP on one op, for the calling thread, so a test can show that the law
//! checks catch it and name the node. A release build has no such switch.

use crate::ops::Grads;
use std::cell::RefCell;
use tapegrad_tensor::{Scalar, Tensor};

thread_local! {
    static PLANTED: RefCell<Option<(String, f64)>> = const { RefCell::new(None) };
}

/// Removes the planted fault when dropped.
#[must_use = "the fault is removed when the guard is dropped"]
pub struct Planted(());

impl Drop for Planted {
    fn drop(&mut self) {
        PLANTED.with(|p| *p.borrow_mut() = None);
    }
}

/// Until the guard is dropped, every VJP of ops named `op` (as `Op::name` spells it) run on this
/// thread multiplies its first contribution by `factor`.
pub fn plant_wrong_vjp(op: &str, factor: f64) -> Planted {
    PLANTED.with(|p| *p.borrow_mut() = Some((op.to_string(), factor)));
    Planted(())
}

/// Applies the planted fault, if any, to the VJP of op `name`.
pub(crate) fn apply<S: Scalar>(name: &str, grads: &mut Grads<S>) {
    PLANTED.with(|p| {
        if let Some((op, factor)) = p.borrow().as_ref() {
            if op == name {
                if let Some(Some(g)) = grads.iter_mut().find(|g| g.is_some()) {
                    let f = S::from_f64(*factor);
                    *g = Tensor::from_writer(g.shape().clone(), |out| {
                        for (o, &v) in out.iter_mut().zip(g.data()) {
                            *o = v * f;
                        }
                    });
                }
            }
        }
    });
}
