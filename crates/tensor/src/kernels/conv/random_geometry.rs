//! Test-only: a fixed sequence of random convolution geometries for checking the phase copy and
//! the gradient scatter against their definitions (strides 1 to 4, dilations 1 to 3, padding 0
//! to 4, odd sizes, rows shorter than a vector, groups).

use super::Conv2dGeometry;

/// `count` valid geometries drawn from `seed` (xorshift, so the same every run).
pub(super) fn random_geometries(count: usize, seed: u64) -> Vec<Conv2dGeometry> {
    let mut state = seed | 1;
    let mut draw = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let groups = 1 + draw(3);
        let (cg, og) = (1 + draw(3), 1 + draw(4));
        let kernel = [1 + draw(5), 1 + draw(5)];
        let stride = [1 + draw(4), 1 + draw(4)];
        let padding = [draw(5), draw(5)];
        let dilation = [1 + draw(3), 1 + draw(3)];
        // Widths up to 40 (several 16-element vector blocks and a tail), mostly shorter.
        let size = |draw: &mut dyn FnMut(usize) -> usize| {
            if draw(3) == 0 {
                1 + draw(40)
            } else {
                1 + draw(12)
            }
        };
        let (h, w) = (size(&mut draw), size(&mut draw));
        let geo = Conv2dGeometry::new(
            "conv2d",
            [1, cg * groups, h, w],
            [og * groups, cg, kernel[0], kernel[1]],
            stride,
            padding,
            dilation,
            groups,
        );
        if let Ok(geo) = geo {
            out.push(geo);
        }
    }
    out
}
