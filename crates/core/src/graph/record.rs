//! A saved graph's per-node record: the tensors a node's VJP declared (`saves`) and its auxiliary
//! data, and nothing the plan already knows (argument and output shapes, which arguments need a
//! gradient), so that a step writes and reads as few bytes per node as it can. Also each
//! thread's spare record list, reused from pass to pass.

use crate::ops::{ArgShapes, ArgValues, Aux, Forward, Saves, VjpContext};
use smallvec::SmallVec;
use std::any::Any;
use std::cell::RefCell;
use tapegrad_tensor::{DType, Scalar, Shape, Tensor};

/// What one node of a saved pass keeps for its VJP.
#[derive(Debug, Clone)]
pub(super) struct Record<S> {
    /// Per argument, its value when the op's `saves` asked for it.
    pub(super) inputs: SmallVec<[Option<Tensor<S>>; 3]>,
    pub(super) output: Option<Tensor<S>>,
    pub(super) aux: Aux<S>,
}

impl<S: Scalar> Record<S> {
    /// Pushes onto `records` what `saves` asks for from one evaluation on `args`, filled where
    /// it lies (a returned record would be copied through the stack). A node none of whose
    /// arguments `needs` a gradient never runs its VJP, so it keeps nothing.
    pub(super) fn keep_onto(
        records: &mut Vec<Self>,
        saves: Saves,
        args: &[&Tensor<S>],
        forward: &Forward<S>,
        needs: &[bool],
    ) {
        records.push(Record {
            inputs: SmallVec::new(),
            output: None,
            aux: Aux::None,
        });
        let Some(record) = records.last_mut() else {
            return;
        };
        if !needs.iter().any(|&n| n) {
            return;
        }
        // Plain pushes: `SmallVec`'s generic `extend` costs more than the few elements it copies.
        for (i, t) in args.iter().enumerate() {
            record
                .inputs
                .push(saves.keeps_input(i).then(|| (*t).clone()));
        }
        if saves.output {
            record.output = Some(forward.value.clone());
        }
        record.aux = forward.aux.clone();
    }

    /// The context the node's VJP reads: this record, with the shapes and needs the plan holds.
    pub(super) fn context<'a>(
        &'a self,
        arg_shapes: &'a [Shape],
        output_shape: &'a Shape,
        needs: &'a [bool],
    ) -> VjpContext<'a, S> {
        VjpContext {
            inputs: ArgValues::Kept(&self.inputs),
            input_shapes: ArgShapes::Shapes(arg_shapes),
            output: self.output.as_ref(),
            output_shape,
            aux: &self.aux,
            needs,
        }
    }
}

/// Each thread's spare record list per scalar type: the inputs-only backward empties a pass's
/// list and leaves it here for the next pass (a graph with many nodes would otherwise allocate
/// its list every step).
struct SpareRecords {
    f32: Vec<Record<f32>>,
    f64: Vec<Record<f64>>,
}

thread_local! {
    static SPARE_RECORDS: RefCell<SpareRecords> = const {
        RefCell::new(SpareRecords {
            f32: Vec::new(),
            f64: Vec::new(),
        })
    };
}

fn with_spare<S: Scalar, R>(f: impl FnOnce(&mut Vec<Record<S>>) -> R) -> Option<R> {
    SPARE_RECORDS
        .try_with(|cell| {
            let mut spare = cell.try_borrow_mut().ok()?;
            let list: &mut dyn Any = match S::DTYPE {
                DType::F32 => &mut spare.f32,
                DType::F64 => &mut spare.f64,
            };
            list.downcast_mut::<Vec<Record<S>>>().map(f)
        })
        .ok()
        .flatten()
}

/// An empty record list with room for `n`: the spare one when it is large enough.
pub(super) fn spare_records<S: Scalar>(n: usize) -> Vec<Record<S>> {
    with_spare::<S, _>(std::mem::take)
        .filter(|v| v.capacity() >= n)
        .unwrap_or_else(|| Vec::with_capacity(n))
}

/// Keeps an emptied record list as the spare if it is larger than the one held.
pub(super) fn give_back_records<S: Scalar>(mut records: Vec<Record<S>>) {
    records.clear();
    with_spare::<S, _>(|spare| {
        if records.capacity() > spare.capacity() {
            *spare = records;
        }
    });
}
