//! Explicit padding of a convolution's input, for what the im2col kernels cannot do themselves:
//! asymmetric zero padding (`padding="same"` with an odd total, as PyTorch: extra on the right)
//! and `nn.Conv2d`'s non-zero `padding_mode`s (reflect, replicate, circular); with its adjoint.

use tapegrad_tensor::kernels::alloc::try_with_capacity;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// PyTorch's string forms of a convolution's `padding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedPadding {
    /// The output has the input's size; needs stride 1. The total padding
    /// `dilation * (kernel - 1)` is split with the odd element on the right (bottom).
    Same,
    /// No padding.
    Valid,
}

impl NamedPadding {
    /// The string PyTorch uses.
    pub fn name(self) -> &'static str {
        match self {
            NamedPadding::Same => "same",
            NamedPadding::Valid => "valid",
        }
    }

    /// The padding named `s`, if it is one.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "same" => Some(NamedPadding::Same),
            "valid" => Some(NamedPadding::Valid),
            _ => None,
        }
    }
}

/// `nn.Conv2d`'s `padding_mode`: what the padded border holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PaddingMode {
    #[default]
    Zeros,
    /// Mirrored without repeating the edge (`[a b c]` padded by 2 reads `c b a b c b a`).
    Reflect,
    /// The edge element repeated.
    Replicate,
    /// Wrapped around (`x[-1]` is the last element).
    Circular,
}

impl PaddingMode {
    /// The string PyTorch uses.
    pub fn name(self) -> &'static str {
        match self {
            PaddingMode::Zeros => "zeros",
            PaddingMode::Reflect => "reflect",
            PaddingMode::Replicate => "replicate",
            PaddingMode::Circular => "circular",
        }
    }

    /// The mode named `s`, if it is one.
    pub fn parse(s: &str) -> Option<Self> {
        [
            PaddingMode::Zeros,
            PaddingMode::Reflect,
            PaddingMode::Replicate,
            PaddingMode::Circular,
        ]
        .into_iter()
        .find(|m| m.name() == s)
    }
}

/// Padding of one axis: `lo` before and `hi` after `len` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AxisPad {
    pub len: usize,
    pub lo: usize,
    pub hi: usize,
}

impl AxisPad {
    fn padded(&self) -> usize {
        self.len + self.lo + self.hi
    }

    /// The input position padded position `i` reads, or `None` for a zero.
    fn source(&self, mode: PaddingMode, i: usize) -> Option<usize> {
        let len = self.len as isize;
        let j = i as isize - self.lo as isize;
        if (0..len).contains(&j) {
            return Some(j as usize);
        }
        let j = match mode {
            PaddingMode::Zeros => return None,
            // `Pad::new` keeps lo, hi < len, so one reflection lands inside.
            PaddingMode::Reflect if j < 0 => -j,
            PaddingMode::Reflect => 2 * (len - 1) - j,
            PaddingMode::Replicate => j.clamp(0, len - 1),
            // `Pad::new` keeps lo, hi <= len, so one wrap lands inside.
            PaddingMode::Circular => j.rem_euclid(len),
        };
        Some(j as usize)
    }
}

/// Padding of the last two axes of `planes` images of `h x w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pad {
    pub planes: usize,
    pub axes: [AxisPad; 2],
    pub mode: PaddingMode,
}

impl Pad {
    /// Checks PyTorch's limits of each mode: reflect needs padding below the axis length,
    /// circular at most the length, replicate a non-empty axis. `axis_names` name the axes.
    pub fn new(
        op: &'static str,
        planes: usize,
        axes: [AxisPad; 2],
        mode: PaddingMode,
        axis_names: [&str; 2],
    ) -> Result<Pad> {
        for (a, name) in axes.iter().zip(axis_names) {
            let widest = a.lo.max(a.hi);
            let fits = match mode {
                PaddingMode::Zeros => true,
                PaddingMode::Reflect => widest < a.len,
                PaddingMode::Circular => widest <= a.len,
                PaddingMode::Replicate => widest == 0 || a.len > 0,
            };
            if !fits {
                let limit = match mode {
                    PaddingMode::Reflect => "less than",
                    PaddingMode::Circular => "at most",
                    _ => "possible only with a non-empty",
                };
                return Err(Error::invalid(
                    op,
                    format!(
                        "padding_mode=\"{}\" needs padding {limit} the input size along {name}, got padding ({}, {}) for size {}",
                        mode.name(),
                        a.lo,
                        a.hi,
                        a.len
                    ),
                ));
            }
            a.len
                .checked_add(a.lo)
                .and_then(|n| n.checked_add(a.hi))
                .ok_or_else(|| {
                    Error::invalid(
                        op,
                        format!("padding ({}, {}) is too large along {name}", a.lo, a.hi),
                    )
                })?;
        }
        Ok(Pad { planes, axes, mode })
    }

    /// `[h, w]` after padding.
    pub fn padded(&self) -> [usize; 2] {
        [self.axes[0].padded(), self.axes[1].padded()]
    }

    /// Calls `f(padded offset, Some(input offset))` for each padded element, in order, or
    /// `None` where it holds a zero.
    fn visit(&self, mut f: impl FnMut(usize, Option<usize>)) {
        let [ah, aw] = self.axes;
        let [ph, pw] = self.padded();
        let in_plane = ah.len * aw.len;
        let mut k = 0;
        for plane in 0..self.planes {
            for r in 0..ph {
                let row = ah.source(self.mode, r);
                for c in 0..pw {
                    let src = row.and_then(|r| {
                        aw.source(self.mode, c)
                            .map(|c| plane * in_plane + r * aw.len + c)
                    });
                    f(k, src);
                    k += 1;
                }
            }
        }
    }

    /// The padded input (flat, `planes x ph x pw`; the kernels read it by element count).
    pub fn apply<S: Scalar>(&self, op: &'static str, x: &Tensor<S>) -> Result<Tensor<S>> {
        let [ph, pw] = self.padded();
        let n = self.planes * ph * pw;
        let mut out = try_with_capacity(op, n)?;
        let src = x.data();
        self.visit(|_, s| out.push(s.map_or(S::ZERO, |i| src[i])));
        Tensor::from_shape(Shape::new([n])?, out)
    }

    /// The adjoint of `apply`: each padded element's gradient added to the input it reads.
    pub fn adjoint<S: Scalar>(&self, g: &[S], input: &Shape) -> Result<Tensor<S>> {
        let mut dx = vec![S::ZERO; input.numel()];
        self.visit(|k, s| {
            if let Some(i) = s {
                dx[i] += g[k];
            }
        });
        Tensor::from_shape(input.clone(), dx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(mode: PaddingMode, len: usize, lo: usize, hi: usize) -> Vec<Option<usize>> {
        let a = AxisPad { len, lo, hi };
        (0..a.padded()).map(|i| a.source(mode, i)).collect()
    }

    /// The index maps of PyTorch's F.pad on `[a b c]` (0, 1, 2) padded by (2, 2).
    #[test]
    fn each_mode_reads_the_positions_pytorch_pads_with() {
        let s = Some;
        assert_eq!(
            read(PaddingMode::Zeros, 3, 2, 2),
            [None, None, s(0), s(1), s(2), None, None]
        );
        assert_eq!(
            read(PaddingMode::Reflect, 3, 2, 2),
            [s(2), s(1), s(0), s(1), s(2), s(1), s(0)]
        );
        assert_eq!(
            read(PaddingMode::Replicate, 3, 2, 2),
            [s(0), s(0), s(0), s(1), s(2), s(2), s(2)]
        );
        assert_eq!(
            read(PaddingMode::Circular, 3, 2, 2),
            [s(1), s(2), s(0), s(1), s(2), s(0), s(1)]
        );
    }
}
