//! The three backward sweeps of docs/design.md section 3.1, all loops over ids from the last to 0:
//! `backward` (executed: skips empty slots), `backward_all` (executed, then zero-filled) and
//! `backward_from` (reference: every node's VJP runs, zero cotangent or not), plus `one_hot`.

use super::finals::{Finals, NoWatch, OnFinal, Watch};
use super::{Node, NodeSaved, Rule, Tape};
#[cfg(debug_assertions)]
use crate::ops::Grads;
use crate::ops::{emit_each, LinearPart, LinearVjp, Op};
use tapegrad_tensor::kernels::sum_to;
use tapegrad_tensor::{Error, Result, Scalar, Tensor};

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

/// Every sweep reports errors under one context, so law 1 can compare error values exactly.
const CONTEXT: &str = "backward";

/// Adds `new` into `slot` as `existing + new` (existing on the left), in place when unshared.
/// Out of line, so that `store` stays small enough to inline into each emit site: the common
/// case, a first contribution, is then one move into the slot.
#[inline(never)]
fn add_into<S: Scalar>(existing: &mut Tensor<S>, new: &Tensor<S>) {
    for (e, &n) in existing.data_mut().iter_mut().zip(new.data()) {
        *e += n; // existing + new, existing on the left
    }
}

impl<S: Scalar> Tape<S> {
    /// Checks a contribution to `pid` and says whether it should be kept (its parent requires grad).
    fn check_contribution(&self, pid: usize, g: &Tensor<S>) -> Result<bool> {
        // A `match`, not `ok_or(Error::..)`: the eager error was built and dropped on every call.
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
                op: parent.op_name(),
                expected: Box::new(parent.value.shape().clone()),
                found: Box::new(g.shape().clone()),
            });
        }
        Ok(parent.requires_grad)
    }

    /// Validates the output id and the seed's shape.
    fn check_seed(&self, out: usize, seed: &Tensor<S>) -> Result<()> {
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
                op: node.op_name(),
                expected: Box::new(node.value.shape().clone()),
                found: Box::new(seed.shape().clone()),
            });
        }
        Ok(())
    }

    /// Adds contribution `g` into `slots[pid]` (dropped when the parent does not require grad).
    fn accumulate(&self, slots: &mut [Option<Tensor<S>>], pid: usize, g: Tensor<S>) -> Result<()> {
        if self.check_contribution(pid, &g)? {
            store(slots, pid, g);
        }
        Ok(())
    }

    /// The executed sweep: slot `out` starts as `seed`, others empty; a node with an empty slot or
    /// without `requires_grad` is skipped, so its VJP never runs.
    pub fn backward(&self, out: usize, seed: &Tensor<S>) -> Result<Vec<Option<Tensor<S>>>> {
        self.check_seed(out, seed)?;
        let mut slots: Vec<Option<Tensor<S>>> = vec![None; self.nodes.len()];
        slots[out] = Some(seed.clone());
        self.sweep(&mut slots, out, |_| true, &mut NoWatch)?;
        Ok(slots)
    }

    /// The executed sweep over `slots` from id `out` down (the slots above it are empty, so
    /// starting there skips only nodes the sweep would skip). An op node's cotangent goes back
    /// into its slot after its VJP when `keep(id)` says so, and is dropped otherwise: nothing
    /// later reads it, since an op node only feeds ids below its own. `watch` is told before
    /// each node and at the end (it only reads the slots).
    fn sweep(
        &self,
        slots: &mut [Option<Tensor<S>>],
        out: usize,
        keep: impl Fn(usize) -> bool,
        watch: &mut impl Watch<S>,
    ) -> Result<()> {
        for id in (0..=out).rev() {
            watch.before(id, slots);
            let node = &self.nodes[id];
            if !node.requires_grad || slots[id].is_none() {
                continue;
            }
            if let (Rule::Op { op, saved }, false) = (&node.rule, self.detect_anomaly) {
                // The hot path: the same pairs (`parents` zipped with the VJP's result), order and
                // errors as the general one below. `op_vjp` checked every parent id and every
                // contribution's shape against its parent's value, so neither is checked again.
                // Contribution `i` goes to `parents[i]`, dropped when that parent does not
                // require grad; an error discards every slot, so what was stored before it is
                // never read.
                if !keep(id) {
                    // Nothing reads this cotangent again: a linear op turns it into its
                    // contributions in place, in its slot.
                    if let Some(linear) = op.linear_vjp() {
                        if self.linear_step(slots, id, node, (op, saved), linear)? {
                            continue;
                        }
                    }
                }
                let Some(cot) = slots[id].take() else {
                    continue;
                };
                let nodes = &self.nodes;
                let parents = &node.parents;
                let grads = self.op_vjp(node, op, saved, &cot)?;
                // A cotangent asked for goes back into its slot after the contributions; any
                // other is freed first.
                let kept = if keep(id) {
                    Some(cot)
                } else {
                    drop(cot);
                    None
                };
                emit_each(grads, |i: usize, g: Tensor<S>| {
                    if let Some(&pid) = parents.get(i) {
                        if nodes.get(pid).is_some_and(|p| p.requires_grad) {
                            store(slots, pid, g);
                        }
                    }
                });
                if kept.is_some() {
                    slots[id] = kept;
                }
                continue;
            }
            let Some(cot) = slots[id].take() else {
                continue;
            };
            let contributions = self.contributions(id, &cot);
            for (pid, g) in contributions.as_ref().into_iter().flatten() {
                if self.detect_anomaly {
                    super::anomaly::check_backward(self, id, &cot, *pid, g)?;
                }
            }
            // Put the cotangent back before accumulating, so a rule that feeds its own id adds on top.
            slots[id] = Some(cot);
            for (pid, g) in contributions? {
                self.accumulate(slots, pid, g)?;
            }
        }
        watch.end(slots);
        Ok(())
    }

    /// One step of the executed sweep for a linear op node `id` (`Op::linear_vjp`) whose
    /// cotangent, in `slots[id]`, nothing reads again: each argument that requires grad gets the
    /// cotangent itself (a clone, sharing its buffer, for all but the last), negated or scaled in
    /// place and summed down to its shape if broadcast, as `Op::vjp` makes it, and in the same
    /// order; the last one's is moved from the node's slot into the parent's, not copied through
    /// the stack. Parent ids are checked first, as `op_vjp` does. Returns false, the slot
    /// untouched, for a node whose parent count is not its op's arity or whose parents are not
    /// all below it (neither can be recorded through the public API), for the general path.
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

    /// The totalised executed sweep (`backward_all`) read at `ids` only: equal, slot for slot, to
    /// picking those ids from `backward_all(out, seed)`, errors included. Cotangents of op nodes
    /// not asked for are freed as soon as their VJP ran, instead of living to the end.
    pub fn backward_at(
        &self,
        out: usize,
        seed: &Tensor<S>,
        ids: &[usize],
    ) -> Result<Vec<Tensor<S>>> {
        self.check_seed(out, seed)?;
        self.backward_at_watched(out, seed, ids, &mut NoWatch)
    }

    /// As [`Tape::backward_at`], also calling `on_final(i, g)` once for every leaf `ids[i]` as
    /// soon as its gradient is final, while the sweep goes on: `g` is the slot's value then
    /// (`None` for zeros), which the sweep no longer changes, so the result holds the same bits.
    /// A leaf is final once the lowest-id node reading it has run; with a custom rule on the
    /// tape (which may feed any id) every leaf is told at the end. Op nodes in `ids` are not told.
    pub fn backward_at_observed(
        &self,
        out: usize,
        seed: &Tensor<S>,
        ids: &[usize],
        on_final: OnFinal<'_, S>,
    ) -> Result<Vec<Tensor<S>>> {
        self.check_seed(out, seed)?;
        for &id in ids {
            self.node(id)?;
        }
        let swept = &self.nodes[..=out];
        let custom = swept.iter().any(|n| matches!(n.rule, Rule::Custom { .. }));
        // The lowest reader of every id, found by one walk down (the last write wins); node 0
        // (told at the end) for all when a custom rule may feed any id.
        let mut reader = vec![custom.then_some(0); self.nodes.len()];
        for (c, node) in swept.iter().enumerate().rev().filter(|_| !custom) {
            for &p in node.parents.iter() {
                if let Some(r) = reader.get_mut(p) {
                    *r = Some(c);
                }
            }
        }
        let leaves = (ids.iter().enumerate())
            .filter(|&(_, &id)| matches!(self.nodes[id].rule, Rule::Leaf))
            .map(|(i, &id)| (id, reader[id], i));
        let mut watch = Finals::new(leaves, on_final);
        self.backward_at_watched(out, seed, ids, &mut watch)
    }

    /// `backward_at` after its checks, telling `watch`.
    fn backward_at_watched(
        &self,
        out: usize,
        seed: &Tensor<S>,
        ids: &[usize],
        watch: &mut impl Watch<S>,
    ) -> Result<Vec<Tensor<S>>> {
        // Leaves (parameters, typically) keep their slots anyway: only op nodes drop theirs. A
        // mask, not a search of `ids`, since the sweep asks once per visited node.
        let mut keep = vec![false; self.nodes.len()];
        for &id in ids {
            let is_op = !matches!(self.node(id)?.rule, Rule::Leaf);
            keep[id] = is_op;
        }
        // Filled with `None` by a loop, which writes only the tag (`vec![None; n]` clones all 72
        // bytes of each).
        let mut slots: Vec<Option<Tensor<S>>> = (0..self.nodes.len()).map(|_| None).collect();
        slots[out] = Some(seed.clone());
        self.sweep(&mut slots, out, |id| keep[id], watch)?;
        Ok(ids
            .iter()
            .map(|&id| match &slots[id] {
                Some(g) => g.clone(),
                None => Tensor::zeros(self.nodes[id].value.shape()),
            })
            .collect())
    }

    /// The executed sweep, then every empty slot becomes zeros of its node's shape. Training runs this.
    pub fn backward_all(&self, out: usize, seed: &Tensor<S>) -> Result<Vec<Tensor<S>>> {
        let slots = self.backward(out, seed)?;
        Ok(slots
            .into_iter()
            .zip(&self.nodes)
            .map(|(g, n)| g.unwrap_or_else(|| Tensor::zeros(n.value.shape())))
            .collect())
    }

    /// The total array with `seed` at `out` and zeros elsewhere.
    pub fn one_hot(&self, out: usize, seed: &Tensor<S>) -> Result<Vec<Tensor<S>>> {
        self.check_seed(out, seed)?;
        Ok(self
            .nodes
            .iter()
            .enumerate()
            .map(|(id, n)| {
                if id == out {
                    seed.clone()
                } else {
                    Tensor::zeros(n.value.shape())
                }
            })
            .collect())
    }

    /// The reference sweep: from a total array (one tensor per node, each of its node's shape),
    /// runs the VJP of every node that requires grad, whatever its cotangent.
    pub fn backward_from(&self, grads: Vec<Tensor<S>>) -> Result<Vec<Tensor<S>>> {
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
                    op: n.op_name(),
                    expected: Box::new(n.value.shape().clone()),
                    found: Box::new(g.shape().clone()),
                });
            }
        }
        let mut acc = grads;
        for id in (0..self.nodes.len()).rev() {
            let node = &self.nodes[id];
            if !node.requires_grad {
                continue;
            }
            let cot = acc[id].clone();
            for (pid, g) in self.contributions(id, &cot)? {
                if self.check_contribution(pid, &g)? {
                    add_into(&mut acc[pid], &g);
                }
            }
        }
        Ok(acc)
    }
}
