//! One node's step of the executed sweeps (`sweeps.rs`): an op node's, through its VJP or, where
//! the op has one, its linear hook (`OpRules::linear_vjp`) applied to the cotangent in place; the
//! general one (custom rules, anomaly mode); how a contribution goes into a slot; the checks.

use super::{Node, NodeSaved, Tape};
#[cfg(debug_assertions)]
use crate::ops::Grads;
use crate::ops::{emit_each, LinearPart, LinearVjp, Op};
use crate::{Error, Result};
use tapegrad_tensor::kernels::sum_to;
use tapegrad_tensor::{Scalar, Tensor};

/// Every sweep reports errors under one context, so law 1 can compare error values exactly.
pub(super) const CONTEXT: &str = "backward";

impl<S: Scalar> Tape<S> {
    /// The step of op node `id` (the hot path), whose slot holds its cotangent: the same pairs
    /// (`parents` zipped with the VJP's result), order and errors as `general_step`.
    /// `op_vjp` checks every parent id and every contribution's shape against its parent's
    /// value, so neither is checked again. Contribution `i` goes to `parents[i]`, dropped when
    /// that parent does not require grad. The cotangent goes back into its slot after the
    /// contributions when `keep`; otherwise it is freed first, or, when the op has a linear
    /// VJP, turned into its contributions in place.
    #[inline(always)]
    pub(super) fn op_step(
        &self,
        slots: &mut [Option<Tensor<S>>],
        id: usize,
        node: &Node<S>,
        (op, saved): (&Op, &NodeSaved<S>),
        keep: bool,
    ) -> Result<()> {
        if !keep {
            if let Some(linear) = op.linear_vjp() {
                if self.linear_step(slots, id, node, (op, saved), linear)? {
                    return Ok(());
                }
            }
        }
        let Some(cot) = slots[id].take() else {
            return Ok(());
        };
        let grads = self.op_vjp(node, op, saved, &cot)?;
        let kept = if keep {
            Some(cot)
        } else {
            drop(cot);
            None
        };
        let nodes = &self.nodes;
        emit_each(grads, |i: usize, g: Tensor<S>| {
            if let Some(&pid) = node.parents.get(i) {
                if nodes.get(pid).is_some_and(|p| p.requires_grad) {
                    store(slots, pid, g);
                }
            }
        });
        if kept.is_some() {
            slots[id] = kept;
        }
        Ok(())
    }

    /// The step of node `id` for a custom rule, and for every node in anomaly mode: the
    /// contributions as `(parent id, contribution)` pairs, each checked (the id, the shape, and
    /// in anomaly mode finiteness) before it is added. The cotangent is back in its slot before
    /// the contributions are added, so a rule that feeds its own id adds on top.
    pub(super) fn general_step(&self, slots: &mut [Option<Tensor<S>>], id: usize) -> Result<()> {
        let Some(cot) = slots[id].take() else {
            return Ok(());
        };
        let contributions = self.contributions(id, &cot);
        if self.detect_anomaly {
            for (pid, g) in contributions.as_ref().into_iter().flatten() {
                super::anomaly::check_backward(self, id, &cot, *pid, g)?;
            }
        }
        slots[id] = Some(cot);
        for (pid, g) in contributions? {
            self.accumulate(slots, pid, g)?;
        }
        Ok(())
    }

    /// The step of op node `id` whose op has the linear VJP `linear` and whose cotangent, in
    /// `slots[id]`, nothing reads again: each argument that requires grad gets the cotangent
    /// itself (a clone, sharing its buffer, for all but the last), its part applied in place and
    /// summed down to its shape if broadcast, as `Op::vjp` makes it, and in the same order; the
    /// last one's is moved from the node's slot into the parent's, not copied through the stack.
    /// Parent ids are checked first, as `op_vjp` does. Returns false, the slot untouched, for a
    /// node whose parent count is not its op's arity or whose parents are not all below it
    /// (neither can be recorded through the public API), for `op_step`'s general path.
    #[inline(always)]
    fn linear_step(
        &self,
        slots: &mut [Option<Tensor<S>>],
        id: usize,
        node: &Node<S>,
        #[allow(unused_variables)] (op, saved): (&Op, &NodeSaved<S>),
        linear: LinearVjp,
    ) -> Result<bool> {
        // Debug builds (the tests) check every step against the op's own VJP, bit for bit.
        #[cfg(debug_assertions)]
        let reference = match &slots[id] {
            Some(cot) => self.op_vjp(node, op, saved, cot),
            None => return Ok(false),
        };
        let check = |_i: usize, _g: &Tensor<S>| {
            #[cfg(debug_assertions)]
            check_linear_step(&reference, _i, _g);
        };
        let (below, from_id) = slots.split_at_mut(id);
        let Some(cot_slot) = from_id.first_mut() else {
            return Ok(false);
        };
        match (linear, &node.parents[..]) {
            (LinearVjp::Unary(part), &[a]) if a < id => {
                let pa = self.parent(a)?;
                if pa.requires_grad {
                    move_part(below, a, pa, part, cot_slot, |g| check(0, g))?;
                }
            }
            (LinearVjp::Binary(part_a, part_b), &[a, b]) if a < id && b < id => {
                let (pa, pb) = (self.parent(a)?, self.parent(b)?);
                match (pa.requires_grad, pb.requires_grad) {
                    (true, true) => {
                        // The first argument gets a clone, the last the cotangent itself.
                        if let Some(cot) = cot_slot.as_ref() {
                            let g = part_a.apply(cot.clone(), pa.value.shape())?;
                            check(0, &g);
                            store(below, a, g);
                        }
                        move_part(below, b, pb, part_b, cot_slot, |g| check(1, g))?;
                    }
                    (true, false) => move_part(below, a, pa, part_a, cot_slot, |g| check(0, g))?,
                    (false, true) => move_part(below, b, pb, part_b, cot_slot, |g| check(1, g))?,
                    (false, false) => {}
                }
            }
            _ => return Ok(false),
        }
        // Whatever is left of the cotangent (nothing, when it was moved) is dropped here.
        *cot_slot = None;
        Ok(true)
    }

    /// Adds contribution `g` into `slots[pid]` (dropped when the parent does not require grad).
    fn accumulate(&self, slots: &mut [Option<Tensor<S>>], pid: usize, g: Tensor<S>) -> Result<()> {
        if self.check_contribution(pid, &g)? {
            store(slots, pid, g);
        }
        Ok(())
    }

    /// Checks a contribution to `pid` and says whether it should be kept (its parent requires grad).
    pub(super) fn check_contribution(&self, pid: usize, g: &Tensor<S>) -> Result<bool> {
        // A `match`, not `ok_or(Error::..)`, which would build and drop the error on every call.
        let Some(parent) = self.nodes.get(pid) else {
            return Err(Error::BadId {
                context: CONTEXT,
                id: pid,
                len: self.nodes.len(),
            });
        };
        if g.shape() != parent.value.shape() {
            return Err(Error::GradShape {
                context: CONTEXT,
                id: pid,
                op: parent.op_name().into(),
                expected: Box::new(parent.value.shape().clone()),
                found: Box::new(g.shape().clone()),
            });
        }
        Ok(parent.requires_grad)
    }

    /// Validates the output id and the seed's shape.
    pub(super) fn check_seed(&self, out: usize, seed: &Tensor<S>) -> Result<()> {
        let Some(node) = self.nodes.get(out) else {
            return Err(Error::BadId {
                context: CONTEXT,
                id: out,
                len: self.nodes.len(),
            });
        };
        if seed.shape() != node.value.shape() {
            return Err(Error::GradShape {
                context: CONTEXT,
                id: out,
                op: node.op_name().into(),
                expected: Box::new(node.value.shape().clone()),
                found: Box::new(seed.shape().clone()),
            });
        }
        Ok(())
    }

    /// Checks a total array: one tensor per node, each of its node's shape.
    pub(super) fn check_total(&self, grads: &[Tensor<S>]) -> Result<()> {
        if grads.len() != self.nodes.len() {
            return Err(Error::GradCount {
                context: CONTEXT,
                expected: self.nodes.len(),
                found: grads.len(),
            });
        }
        for (id, (g, n)) in grads.iter().zip(&self.nodes).enumerate() {
            if g.shape() != n.value.shape() {
                return Err(Error::GradShape {
                    context: CONTEXT,
                    id,
                    op: n.op_name().into(),
                    expected: Box::new(n.value.shape().clone()),
                    found: Box::new(g.shape().clone()),
                });
            }
        }
        Ok(())
    }
}

/// Stores contribution `g` into an empty slot, or adds it onto the slot's value.
#[inline(always)]
fn store<S: Scalar>(slots: &mut [Option<Tensor<S>>], pid: usize, g: Tensor<S>) {
    match &mut slots[pid] {
        Some(existing) => add_into(existing, &g),
        // Forgetting the empty slot's `None` (which holds nothing) spares a call of its drop
        // glue on every first contribution.
        empty => std::mem::forget(empty.replace(g)),
    }
}

/// Adds `new` into `slot` as `existing + new` (existing on the left), in place when unshared.
/// Out of line, so that `store` stays small enough to inline into each emit site: the common
/// case, a first contribution, is then one move into the slot.
#[inline(never)]
pub(super) fn add_into<S: Scalar>(existing: &mut Tensor<S>, new: &Tensor<S>) {
    for (e, &n) in existing.data_mut().iter_mut().zip(new.data()) {
        *e += n; // existing + new, existing on the left
    }
}

/// Applies linear `part` to the cotangent in `cot_slot` in place and hands the result to parent
/// `pid` (value `parent`): moved into an empty slot, added onto a full one (existing on the
/// left), or, when the parent was broadcast, summed down to its shape first. `check` sees the
/// contribution before it is stored.
#[inline(always)]
fn move_part<S: Scalar>(
    below: &mut [Option<Tensor<S>>],
    pid: usize,
    parent: &Node<S>,
    part: LinearPart,
    cot_slot: &mut Option<Tensor<S>>,
    check: impl Fn(&Tensor<S>),
) -> Result<()> {
    let Some(cot) = cot_slot.as_mut() else {
        return Ok(());
    };
    part.apply_in_place(cot);
    if cot.shape() != parent.value.shape() {
        let g = sum_to(cot, parent.value.shape())?;
        check(&g);
        store(below, pid, g);
        return Ok(());
    }
    check(cot);
    match &mut below[pid] {
        Some(existing) => add_into(existing, cot),
        empty => std::mem::swap(empty, cot_slot),
    }
    Ok(())
}

/// Panics unless a linear step's contribution to argument `i` equals the op's VJP
/// (`reference`) bit for bit: a debug-build check of an invariant, never of user input.
#[cfg(debug_assertions)]
fn check_linear_step<S: Scalar>(reference: &Result<Grads<S>>, i: usize, g: &Tensor<S>) {
    let bits =
        |t: &Tensor<S>| -> Vec<u64> { t.data().iter().map(|v| v.to_f64().to_bits()).collect() };
    match reference {
        Ok(grads) => match grads.get(i) {
            Some(Some(r)) => assert!(
                g.shape() == r.shape() && bits(g) == bits(r),
                "linear step of argument {i} differs from the op's vjp"
            ),
            _ => panic!("the op's vjp gave no contribution to argument {i}"),
        },
        Err(e) => panic!("the linear step succeeded where the op's vjp failed: {e}"),
    }
}
