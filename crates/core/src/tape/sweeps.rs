//! The three backward sweeps of docs/design.md section 3.1, each a loop over ids from the last
//! to 0: `backward_from` (the reference: every node's VJP runs, zero cotangent or not), then the
//! executed ones, which skip empty slots: `backward`, `backward_all`, `backward_at` and the
//! observed `backward_at_observed`. What one node's step does is in `steps.rs`.

use super::finals::{Finals, NoWatch, OnFinal, Watch};
use super::steps::add_into;
use super::{Rule, Tape};
use crate::Result;
use tapegrad_tensor::{Scalar, Tensor};

impl<S: Scalar> Tape<S> {
    /// The reference sweep: from a total array (one tensor per node, each of its node's shape),
    /// runs the VJP of every node that requires grad, whatever its cotangent, and adds each
    /// contribution into its parent's slot (dropped where the parent does not require grad).
    pub fn backward_from(&self, grads: Vec<Tensor<S>>) -> Result<Vec<Tensor<S>>> {
        self.check_total(&grads)?;
        let mut acc = grads;
        for id in (0..self.nodes.len()).rev() {
            if !self.nodes[id].requires_grad {
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

    /// The executed sweep: slot `out` starts as `seed`, others empty; a node with an empty slot or
    /// without `requires_grad` is skipped, so its VJP never runs.
    pub fn backward(&self, out: usize, seed: &Tensor<S>) -> Result<Vec<Option<Tensor<S>>>> {
        self.check_seed(out, seed)?;
        let mut slots: Vec<Option<Tensor<S>>> = vec![None; self.nodes.len()];
        slots[out] = Some(seed.clone());
        self.sweep(&mut slots, out, |_| true, &mut NoWatch)?;
        Ok(slots)
    }

    /// The loop of every executed sweep, over `slots` from id `out` down (the slots above it are
    /// empty, so starting there skips only nodes the sweep would skip). An op node's cotangent
    /// goes back into its slot after its VJP when `keep(id)` says so, and is dropped otherwise:
    /// nothing later reads it, since an op node only feeds ids below its own. `watch` is told
    /// before each node and at the end (it only reads the slots). An error discards every slot,
    /// so what was stored before it is never read.
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
            match (&node.rule, self.detect_anomaly) {
                (Rule::Op { op, saved }, false) => {
                    self.op_step(slots, id, node, (op, saved), keep(id))?
                }
                _ => self.general_step(slots, id)?,
            }
        }
        watch.end(slots);
        Ok(())
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
        let reader = self.lowest_readers(out);
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

    /// Per id, the lowest id among the nodes up to `out` that read it (`None`: none does), found
    /// by one walk down, the last write winning. Node 0 (told at the end) for every id when a
    /// custom rule, which may feed any id, is among them.
    fn lowest_readers(&self, out: usize) -> Vec<Option<usize>> {
        let swept = &self.nodes[..=out];
        let custom = swept.iter().any(|n| matches!(n.rule, Rule::Custom { .. }));
        let mut reader = vec![custom.then_some(0); self.nodes.len()];
        for (c, node) in swept.iter().enumerate().rev().filter(|_| !custom) {
            for &p in node.parents.iter() {
                if let Some(r) = reader.get_mut(p) {
                    *r = Some(c);
                }
            }
        }
        reader
    }
}
