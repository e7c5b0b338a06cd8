//! `Parents`: a node's parent ids, kept for display and for readers of the tape's structure
//! (the sweeps use only what a node's rule emits). Up to three ids sit in the node itself.

use std::ops::Deref;

/// A node's parent ids in argument order; derefs to `[usize]`. Three fit inline (every op
/// but `concat` and a few `nn` ops), so the list costs a node 32 bytes and no allocation.
#[derive(Clone, PartialEq, Eq)]
pub struct Parents(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    Inline { len: u8, ids: [usize; INLINE] },
    Heap(Box<[usize]>),
}

const INLINE: usize = 3;

impl Parents {
    /// No parents (a leaf).
    #[inline]
    pub const fn none() -> Self {
        Parents(Repr::Inline {
            len: 0,
            ids: [0; INLINE],
        })
    }

    /// The ids of `args`, in order.
    #[inline(always)]
    pub fn from_slice(args: &[usize]) -> Self {
        // One arm per inline length: a copy loop became a `memcpy` call for a few bytes.
        let (ids, len) = match *args {
            [] => ([0, 0, 0], 0),
            [a] => ([a, 0, 0], 1),
            [a, b] => ([a, b, 0], 2),
            [a, b, c] => ([a, b, c], 3),
            _ => return Parents(Repr::Heap(args.into())),
        };
        Parents(Repr::Inline { len, ids })
    }
}

impl Default for Parents {
    fn default() -> Self {
        Parents::none()
    }
}

impl Deref for Parents {
    type Target = [usize];

    #[inline]
    fn deref(&self) -> &[usize] {
        match &self.0 {
            Repr::Inline { len, ids } => ids.get(..usize::from(*len)).unwrap_or(ids),
            Repr::Heap(ids) => ids,
        }
    }
}

impl<'a> IntoIterator for &'a Parents {
    type Item = &'a usize;
    type IntoIter = std::slice::Iter<'a, usize>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl std::fmt::Debug for Parents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::Parents;

    #[test]
    fn keeps_ids_in_order_inline_and_on_the_heap() {
        for n in 0..7 {
            let ids: Vec<usize> = (0..n).map(|i| 10 * i + 3).collect();
            let p = Parents::from_slice(&ids);
            assert_eq!(&p[..], &ids[..]);
            assert_eq!(format!("{p:?}"), format!("{ids:?}"));
            assert_eq!(p.clone(), p);
        }
        assert!(Parents::none().is_empty());
        assert_eq!(std::mem::size_of::<Parents>(), 32);
    }
}
