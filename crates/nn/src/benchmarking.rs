//! Benchmark support, used by no training path: the MLP training step that `tapegrad bench mlp`,
//! the `backend_ab` example and anyone reproducing a figure build from the same seeds, the model,
//! batch and optimizer that `bench/pytorch_baseline.py` describes.

use crate::data::{Batch, BatchTargets};
use crate::layers::Activation;
use crate::{Model, ModelSpec, NnResult, Optimizer, OptimizerConfig};
use rand::{Rng, SeedableRng};
use tapegrad_tensor::{Shape, Tensor};

/// The layer widths of the benchmark MLP, input first.
pub const MLP_WIDTHS: [usize; 4] = [784, 256, 128, 10];

/// A model 784-256-128-10 with ReLU (seed 0), one fixed batch of `rows` inputs uniform in
/// [-1, 1) with labels below 10 (ChaCha8 seed 0), and plain SGD at lr 0.01 without momentum,
/// as PyTorch's `torch.optim.SGD(params, lr=0.01)` in the baseline (the trainer's `sgd` default
/// has momentum 0.9, which would add a velocity pass PyTorch skips).
pub struct MlpStep {
    pub model: Model<f32>,
    pub batch: Batch<f32>,
    pub optimizer: Optimizer<f32>,
}

impl MlpStep {
    pub fn new(rows: usize) -> NnResult<MlpStep> {
        let [inputs, first, second, outputs] = MLP_WIDTHS;
        let spec = ModelSpec::Mlp {
            inputs,
            hidden: vec![first, second],
            outputs,
            activation: Activation::Relu,
            dropout: 0.0,
        };
        let model = Model::new(&spec, 0)?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let shape = Shape::new([rows, inputs])?;
        let data = (0..shape.numel())
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let x = Tensor::from_shape(shape, data)?;
        let labels = (0..rows).map(|_| rng.random_range(0..outputs)).collect();
        let plain_sgd = OptimizerConfig::Sgd {
            lr: 0.01,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        let optimizer = Optimizer::new(plain_sgd, &model.params)?;
        Ok(MlpStep {
            model,
            batch: Batch {
                x,
                y: BatchTargets::Classes(labels),
            },
            optimizer,
        })
    }

    /// Floating-point operations of one step's matrix products at `rows` (a multiply-add counts
    /// as two): the forward's three, the three weight gradients, and the input gradients of the
    /// second and third layers (nothing asks for the first layer's). The elementwise work (bias,
    /// ReLU, softmax, the update) is not counted, so at batch 1, where the update's pass over the
    /// weights is as large as the products, the figure understates the work done.
    pub fn gemm_flops(rows: usize) -> f64 {
        let layers: Vec<(f64, f64)> = MLP_WIDTHS
            .windows(2)
            .map(|w| (w[0] as f64, w[1] as f64))
            .collect();
        let products: f64 = layers.iter().map(|(i, o)| i * o).sum();
        let first = layers[0].0 * layers[0].1;
        2.0 * rows as f64 * (3.0 * products - first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_is_seeded_and_its_flops_count_every_product() {
        let a = MlpStep::new(5).unwrap();
        let b = MlpStep::new(5).unwrap();
        assert_eq!(a.batch.x.dims(), [5, 784]);
        assert_eq!(a.batch.x.data(), b.batch.x.data());
        assert!(a.batch.x.data().iter().all(|v| (-1.0..1.0).contains(v)));
        match (&a.batch.y, &b.batch.y) {
            (BatchTargets::Classes(la), BatchTargets::Classes(lb)) => {
                assert_eq!(la, lb);
                assert!(la.len() == 5 && la.iter().all(|&l| l < 10));
            }
            _ => panic!("the benchmark batch has class labels"),
        }
        // Forward x W1^T, x W2^T, x W3^T and their weight gradients; input gradients of layers
        // 2 and 3 only: 8 products at batch 4.
        let (l1, l2, l3) = (784.0 * 256.0, 256.0 * 128.0, 128.0 * 10.0);
        let macs = 4.0 * (2.0 * l1 + 3.0 * l2 + 3.0 * l3);
        assert_eq!(MlpStep::gemm_flops(4), 2.0 * macs);
    }
}
