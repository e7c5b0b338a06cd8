//! Seeded initialisers with PyTorch's definitions: Kaiming (He) and Xavier (Glorot), uniform and
//! normal, plus constants. Values are drawn in f64 from a ChaCha8 stream and rounded to the model's
//! element type, so f32 and f64 models built from one seed start from the same numbers.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tapegrad_tensor::{Error, Result, Scalar, Shape, Tensor};

/// How to fill a new tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Every element `value`.
    Constant(f64),
    /// `U(low, high)`.
    Uniform { low: f64, high: f64 },
    /// `N(mean, std^2)`.
    Normal { mean: f64, std: f64 },
    /// `kaiming_uniform_(mode="fan_in")`: `U(-b, b)` with `b = gain * sqrt(3 / fan_in)` and
    /// `gain = sqrt(2 / (1 + a^2))` (leaky-ReLU slope `a`; `a = 0` is ReLU's He init, `a = sqrt(5)`
    /// is PyTorch's default for `Linear` and `Conv2d` weights, giving `b = 1 / sqrt(fan_in)`).
    KaimingUniform { a: f64 },
    /// `kaiming_normal_(mode="fan_in")`: `N(0, std^2)` with `std = gain / sqrt(fan_in)`.
    KaimingNormal { a: f64 },
    /// `xavier_uniform_`: `U(-b, b)` with `b = gain * sqrt(6 / (fan_in + fan_out))`.
    XavierUniform { gain: f64 },
    /// `xavier_normal_`: `N(0, std^2)` with `std = gain * sqrt(2 / (fan_in + fan_out))`.
    XavierNormal { gain: f64 },
}

/// PyTorch's `_calculate_fan_in_and_fan_out`: for a weight of shape `[out, in, k...]`,
/// `fan_in = in * prod(k)` and `fan_out = out * prod(k)`.
pub fn fans(shape: &Shape) -> Result<(usize, usize)> {
    let dims = shape.dims();
    if dims.len() < 2 {
        return Err(Error::invalid(
            "init",
            format!("fan in and fan out need at least 2 dimensions, found shape {shape}"),
        ));
    }
    let receptive: usize = dims[2..].iter().product();
    Ok((dims[1] * receptive, dims[0] * receptive))
}

/// One standard normal draw (Box-Muller on two uniforms; deterministic for a given stream).
pub fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    // 1 - u keeps the logarithm's argument in (0, 1].
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

impl Init {
    /// A tensor of `shape` filled by this rule from `rng`. A shape too large to allocate is an
    /// error naming it, not an allocation abort: layer widths come from user input (`--hidden`).
    pub fn tensor<S: Scalar>(&self, shape: &Shape, rng: &mut ChaCha8Rng) -> Result<Tensor<S>> {
        let draw = self.draw(shape)?;
        let n = shape.numel();
        let mut data = Vec::new();
        data.try_reserve_exact(n).map_err(|_| {
            Error::invalid(
                "init",
                format!(
                    "cannot allocate a parameter of shape {shape}: {n} elements of {} bytes",
                    std::mem::size_of::<S>()
                ),
            )
        })?;
        data.extend((0..n).map(|_| S::from_f64(draw.sample(rng))));
        Tensor::from_shape(shape.clone(), data)
    }

    /// The distribution this rule gives a tensor of `shape` (fans are taken from the shape).
    fn draw(&self, shape: &Shape) -> Result<Draw> {
        let gain = |a: f64| (2.0 / (1.0 + a * a)).sqrt();
        let symmetric = |bound: f64| Draw::Uniform {
            low: -bound,
            high: bound,
        };
        Ok(match *self {
            Init::Constant(v) => Draw::Constant(v),
            Init::Uniform { low, high } => {
                if low.is_nan() || high.is_nan() || low > high {
                    return Err(Error::invalid(
                        "init",
                        format!("uniform bounds must satisfy low <= high, found {low} > {high}"),
                    ));
                }
                Draw::Uniform { low, high }
            }
            Init::Normal { mean, std } => Draw::Normal { mean, std },
            Init::KaimingUniform { a } => {
                let (fan_in, _) = fans(shape)?;
                symmetric(gain(a) * (3.0 / fan_in.max(1) as f64).sqrt())
            }
            Init::KaimingNormal { a } => {
                let (fan_in, _) = fans(shape)?;
                Draw::Normal {
                    mean: 0.0,
                    std: gain(a) / (fan_in.max(1) as f64).sqrt(),
                }
            }
            Init::XavierUniform { gain } => {
                let (fi, fo) = fans(shape)?;
                symmetric(gain * (6.0 / (fi + fo).max(1) as f64).sqrt())
            }
            Init::XavierNormal { gain } => {
                let (fi, fo) = fans(shape)?;
                Draw::Normal {
                    mean: 0.0,
                    std: gain * (2.0 / (fi + fo).max(1) as f64).sqrt(),
                }
            }
        })
    }
}

/// One element's distribution, drawn in f64.
enum Draw {
    Constant(f64),
    Uniform { low: f64, high: f64 },
    Normal { mean: f64, std: f64 },
}

impl Draw {
    fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        match *self {
            Draw::Constant(v) => v,
            Draw::Uniform { low, high } => rng.random_range(low..=high),
            Draw::Normal { mean, std } => mean + std * standard_normal(rng),
        }
    }
}
