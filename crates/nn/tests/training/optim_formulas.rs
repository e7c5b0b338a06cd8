//! Worked examples: each optimizer on two parameters `p0 = [1, -2]` with the gradient sequence
//! `[0.5, 0.25], [-1, 0.5], [0.25, -0.75]`, against numbers computed by hand from PyTorch's
//! update formulas (the step-1 arithmetic is written out; later steps follow the same formula).
//! Checked in f64 to a few ulps and in f32 to its precision.

use tapegrad_nn::init::Init;
use tapegrad_nn::layers::Builder;
use tapegrad_nn::{Optimizer, OptimizerConfig, ParamSet};
use tapegrad_tensor::{Scalar, Tensor};

const GRADS: [[f64; 2]; 3] = [[0.5, 0.25], [-1.0, 0.5], [0.25, -0.75]];

fn run<S: Scalar>(config: OptimizerConfig) -> Vec<Vec<f64>> {
    let mut params = ParamSet::<S>::new();
    let mut rng = tapegrad_nn::rng::init_rng(0);
    let id = Builder::new(&mut params, &mut rng)
        .trainable("", "p", &[2], Init::Constant(0.0))
        .unwrap();
    params
        .set(id, Tensor::from_f64(&[2], &[1.0, -2.0]).unwrap())
        .unwrap();
    let mut opt = Optimizer::new(config, &params).unwrap();
    GRADS
        .iter()
        .map(|g| {
            let g = Tensor::<S>::from_f64(&[2], g).unwrap();
            opt.step(&mut params, &[g], config.lr()).unwrap();
            params.get(id).value.to_f64_vec()
        })
        .collect()
}

fn check(config: OptimizerConfig, expected: [[f64; 2]; 3]) {
    let got64 = run::<f64>(config);
    let got32 = run::<f32>(config);
    for (step, want) in expected.iter().enumerate() {
        for i in 0..2 {
            let (a, b) = (got64[step][i], want[i]);
            assert!(
                (a - b).abs() <= 4.0 * f64::EPSILON * b.abs().max(1.0),
                "{} f64 step {} element {i}: got {a:e}, expected {b:e}",
                config.name(),
                step + 1
            );
            let a32 = got32[step][i];
            assert!(
                (a32 - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{} f32 step {} element {i}: got {a32:e}, expected {b:e}",
                config.name(),
                step + 1
            );
        }
    }
}

#[test]
fn sgd_plain() {
    // p = p - lr * g: 1 - 0.1 * 0.5 = 0.95; -2 - 0.1 * 0.25 = -2.025.
    check(
        OptimizerConfig::Sgd {
            lr: 0.1,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        },
        [
            [0.95, -2.025],
            [1.05, -2.0749999999999997],
            [1.0250000000000001, -1.9999999999999998],
        ],
    );
}

#[test]
fn sgd_momentum_dampening_weight_decay() {
    // Step 1: g = 0.5 + 0.01 * 1 = 0.51; the first buffer is a copy of g (no dampening);
    //         p = 1 - 0.1 * 0.51 = 0.949.
    // Step 2: g = -1 + 0.01 * 0.949 = -0.99051; b = 0.9 * 0.51 + (1 - 0.1) * -0.99051 = -0.432459;
    //         p = 0.949 + 0.0432459 = 0.9922459.
    check(
        OptimizerConfig::Sgd {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.1,
            nesterov: false,
            weight_decay: 0.01,
        },
        [
            [0.949, -2.023],
            [0.9922458999999999, -2.0868793],
            [1.0077741886899998, -2.07499247863],
        ],
    );
}

#[test]
fn sgd_nesterov() {
    // Step 1: b = g = 0.5; g' = g + 0.9 * b = 0.95; p = 1 - 0.1 * 0.95 = 0.905.
    check(
        OptimizerConfig::Sgd {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: true,
            weight_decay: 0.0,
        },
        [[0.905, -2.0475], [1.0545, -2.16275], [1.05155, -2.078975]],
    );
}

#[test]
fn adam() {
    // Step 1: m = 0.1 * 0.5 = 0.05; v = 0.001 * 0.25 = 0.00025; step size = 0.1 / (1 - 0.9) = 1;
    //         denom = sqrt(0.00025) / sqrt(0.001) + 1e-8 = 0.5 + 1e-8;
    //         p = 1 - 0.05 / (0.5 + 1e-8) = 0.900000002 (to 10 digits).
    check(
        OptimizerConfig::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        [
            [0.900000002, -2.099999996],
            [0.9366103542405654, -2.1965181961408047],
            [0.9502794203389762, -2.1898582947061844],
        ],
    );
}

#[test]
fn adam_with_l2_weight_decay() {
    // Step 1: g = 0.5 + 0.1 * 1 = 0.6, then as plain Adam: p = 1 - 0.06 / (0.6 + 1e-8).
    check(
        OptimizerConfig::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        },
        [
            [0.9000000016666666, -2.099999980000004],
            [0.9252635194456061, -2.1847119740372833],
            [0.9247305742687093, -2.142616403553081],
        ],
    );
}

#[test]
fn adamw_decoupled_weight_decay() {
    // Step 1: p = 1 * (1 - 0.1 * 0.1) = 0.99, then the Adam step of plain Adam: 0.99 - 0.099999998.
    check(
        OptimizerConfig::AdamW {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        },
        [
            [0.890000002, -2.079999996],
            [0.9177103542205653, -2.1557181961808047],
            [0.9222023167767704, -2.1275011127843766],
        ],
    );
}

#[test]
fn rmsprop() {
    // Step 1: v = 0.01 * 0.25 = 0.0025; avg = 0.05 + 1e-8; p = 1 - 0.01 * 0.5 / (0.05 + 1e-8).
    check(
        OptimizerConfig::RmsProp {
            lr: 0.01,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
        },
        [
            [0.900000019999996, -2.099999960000016],
            [0.9895323081911337, -2.1895322401751236],
            [0.9675849574904029, -2.1091817993830664],
        ],
    );
}

#[test]
fn rmsprop_centered_momentum_weight_decay() {
    // Step 1: g = 0.5 + 0.1 = 0.6; v = 0.1 * 0.36 = 0.036; a = 0.1 * 0.6 = 0.06;
    //         avg = sqrt(0.036 - 0.0036) + 1e-8 = 0.18 + 1e-8; b = 0.6 / avg;
    //         p = 1 - 0.01 * b = 0.96666666851...
    check(
        OptimizerConfig::RmsProp {
            lr: 0.01,
            alpha: 0.9,
            eps: 1e-8,
            weight_decay: 0.1,
            momentum: 0.5,
            centered: true,
        },
        [
            [0.9666666685185185, -2.033333311111126],
            [0.9769105591555269, -2.083465054275333],
            [0.9717656120451559, -2.0775568854694013],
        ],
    );
}

#[test]
fn adagrad() {
    // Step 1: g = 0.5 + 0.1 * 1 = 0.6; clr = 0.1; sum = 0.25 + 0.36 = 0.61;
    //         p = 1 - 0.1 * 0.6 / (sqrt(0.61) + 1e-10) = 0.92317787...
    // Step 2 uses clr = 0.1 / (1 + 1 * 0.5).
    check(
        OptimizerConfig::Adagrad {
            lr: 0.1,
            lr_decay: 0.5,
            weight_decay: 0.1,
            initial_accumulator_value: 0.25,
            eps: 1e-10,
        },
        [
            [0.9231778720500985, -2.0099503719001195],
            [0.9737120380103808, -2.044041005042756],
            [0.9597817227151648, -2.001406329562165],
        ],
    );
}

#[test]
fn state_slots_follow_pytorch() {
    let mut params = ParamSet::<f64>::new();
    let mut rng = tapegrad_nn::rng::init_rng(0);
    Builder::new(&mut params, &mut rng)
        .trainable("", "w", &[3], Init::Constant(1.0))
        .unwrap();
    let cfg = OptimizerConfig::by_name("adam", 0.1).unwrap();
    let mut opt = Optimizer::new(cfg, &params).unwrap();
    assert!(
        opt.state_entries().is_empty(),
        "adam creates its state on the first step"
    );
    opt.step(
        &mut params,
        &[Tensor::from_f64(&[3], &[1.0, 2.0, 3.0]).unwrap()],
        0.1,
    )
    .unwrap();
    let names: Vec<&str> = opt.state_entries().iter().map(|e| e.0).collect();
    assert_eq!(names, ["exp_avg", "exp_avg_sq"]);
    assert_eq!(opt.state_entries()[0].2.dims(), &[3]);
    let ada = Optimizer::new(OptimizerConfig::by_name("adagrad", 0.1).unwrap(), &params).unwrap();
    assert_eq!(
        ada.state_entries().len(),
        1,
        "adagrad fills its sum at construction"
    );
}

#[test]
fn invalid_hyper_parameters_are_errors() {
    let nesterov = OptimizerConfig::Sgd {
        lr: 0.1,
        momentum: 0.0,
        dampening: 0.0,
        nesterov: true,
        weight_decay: 0.0,
    };
    let e = nesterov.validate().unwrap_err().to_string();
    assert!(e.contains("nesterov"), "{e}");
    let e = OptimizerConfig::by_name("adam", -1.0)
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("learning rate"), "{e}");
    let e = OptimizerConfig::by_name("lion", 0.1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown optimizer 'lion'"), "{e}");
}

#[test]
fn wrong_gradient_count_or_shape_is_an_error() {
    let mut params = ParamSet::<f32>::new();
    let mut rng = tapegrad_nn::rng::init_rng(0);
    Builder::new(&mut params, &mut rng)
        .trainable("", "w", &[2], Init::Constant(1.0))
        .unwrap();
    let mut opt = Optimizer::new(OptimizerConfig::by_name("sgd", 0.1).unwrap(), &params).unwrap();
    assert!(opt.step(&mut params, &[], 0.1).is_err());
    let e = opt
        .step(
            &mut params,
            &[Tensor::zeros(
                &tapegrad_tensor::Shape::new(vec![3]).unwrap(),
            )],
            0.1,
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("[2]") && e.to_string().contains("[3]"),
        "{e}"
    );
}
