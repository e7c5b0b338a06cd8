//! Telling the caller of a backward sweep when a leaf's gradient is final, while the sweep goes
//! on (a data-parallel trainer starts exchanging gradients then). Sweeps run ids from the last
//! down, so a leaf's gradient is final once the sweep has run the lowest-id node that reads it.

use tapegrad_tensor::Tensor;

/// What a sweep tells at each step: nothing (`NoWatch`, compiled away) or `Finals`.
pub(crate) trait Watch<S> {
    /// Before the sweep runs node `id`: reports every leaf whose gradient is final by now.
    fn before(&mut self, id: usize, slots: &[Option<Tensor<S>>]);
    /// After the sweep: reports every leaf not reported yet.
    fn end(&mut self, slots: &[Option<Tensor<S>>]);
}

/// The sweep without an observer.
pub(crate) struct NoWatch;

impl<S> Watch<S> for NoWatch {
    #[inline(always)]
    fn before(&mut self, _id: usize, _slots: &[Option<Tensor<S>>]) {}
    #[inline(always)]
    fn end(&mut self, _slots: &[Option<Tensor<S>>]) {}
}

/// The callback of an observed sweep: `(index, gradient)`, `None` standing for zeros.
pub type OnFinal<'a, S> = &'a mut dyn FnMut(usize, Option<&Tensor<S>>);

/// The leaves an observed sweep reports, in the order their gradients become final.
pub(crate) struct Finals<'a, S> {
    /// `(lowest reader, slot, reported index)`, by lowest reader descending, then index. A leaf
    /// read by nothing the sweep runs has `usize::MAX`: final from the start.
    events: Vec<(usize, usize, usize)>,
    next: usize,
    report: OnFinal<'a, S>,
}

impl<'a, S> Finals<'a, S> {
    /// `leaves` gives, per leaf, its slot, the lowest id of a node the sweep runs that reads it
    /// (`None`: no such node) and the index to report it under.
    pub(crate) fn new(
        leaves: impl IntoIterator<Item = (usize, Option<usize>, usize)>,
        report: OnFinal<'a, S>,
    ) -> Self {
        let mut events: Vec<(usize, usize, usize)> = leaves
            .into_iter()
            .map(|(slot, reader, index)| (reader.unwrap_or(usize::MAX), slot, index))
            .collect();
        events.sort_by(|a, b| b.0.cmp(&a.0).then(a.2.cmp(&b.2)));
        Finals {
            events,
            next: 0,
            report,
        }
    }

    fn report(&mut self, slots: &[Option<Tensor<S>>]) {
        let (_, slot, index) = self.events[self.next];
        (self.report)(index, slots.get(slot).and_then(Option::as_ref));
        self.next += 1;
    }
}

impl<S> Watch<S> for Finals<'_, S> {
    fn before(&mut self, id: usize, slots: &[Option<Tensor<S>>]) {
        // Every node above `id` has run: a leaf whose lowest reader is among them is final.
        while self.events.get(self.next).is_some_and(|e| e.0 > id) {
            self.report(slots);
        }
    }

    fn end(&mut self, slots: &[Option<Tensor<S>>]) {
        while self.next < self.events.len() {
            self.report(slots);
        }
    }
}
