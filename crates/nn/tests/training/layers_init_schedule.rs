//! Layers, initialisers, schedules and clipping: PyTorch's default bounds for `Linear`, Kaiming
//! and Xavier statistics, dropout's mask and scale, MLP naming, schedule closed forms, and
//! `clip_grad_norm`.

use tapegrad_core::Session;
use tapegrad_nn::clip::{clip_grad_norm, global_norm};
use tapegrad_nn::init::{fans, Init};
use tapegrad_nn::layers::{Activation, Ctx, Dropout, Mode};
use tapegrad_nn::rng::{dropout_rng, init_rng};
use tapegrad_nn::{Decay, Model, ModelSpec, Schedule};
use tapegrad_tensor::{Shape, Tensor};

fn mlp(hidden: Vec<usize>, dropout: f64) -> ModelSpec {
    ModelSpec::Mlp {
        inputs: 64,
        hidden,
        outputs: 10,
        activation: Activation::Relu,
        dropout,
    }
}

#[test]
fn mlp_names_and_shapes_follow_pytorch_sequential() {
    let m = Model::<f32>::new(&mlp(vec![32, 16], 0.5), 0).unwrap();
    let names: Vec<(String, Vec<usize>)> = m
        .params
        .iter()
        .map(|p| (p.name.clone(), p.value.dims().to_vec()))
        .collect();
    // Linear, ReLU, Dropout, Linear, ReLU, Dropout, Linear: indices 0, 3, 6.
    assert_eq!(
        names,
        [
            ("0.weight".to_string(), vec![32, 64]),
            ("0.bias".to_string(), vec![32]),
            ("3.weight".to_string(), vec![16, 32]),
            ("3.bias".to_string(), vec![16]),
            ("6.weight".to_string(), vec![10, 16]),
            ("6.bias".to_string(), vec![10]),
        ]
    );
    assert_eq!(
        m.params.trainable_count(),
        64 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10
    );
}

#[test]
fn linear_default_init_is_uniform_within_one_over_sqrt_fan_in() {
    let m = Model::<f64>::new(&mlp(vec![100], 0.0), 7).unwrap();
    let bound = 1.0 / 64f64.sqrt();
    for p in m.params.iter().take(2) {
        let v = p.value.data();
        assert!(
            v.iter().all(|x| x.abs() <= bound),
            "{} exceeds {bound}",
            p.name
        );
        // 6400 draws from U(-b, b): the extremes come close to the bound, the mean to zero.
        let max = v.iter().cloned().fold(0.0, f64::max);
        assert!(max > 0.95 * bound, "{}: max {max}", p.name);
    }
    let w = m.params.iter().next().unwrap().value.data();
    let mean = w.iter().sum::<f64>() / w.len() as f64;
    let var = w.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / w.len() as f64;
    assert!(mean.abs() < 0.01, "mean {mean}");
    // Var of U(-b, b) is b^2 / 3.
    assert!(
        (var / (bound * bound / 3.0) - 1.0).abs() < 0.06,
        "variance {var}"
    );
}

#[test]
fn kaiming_and_xavier_statistics() {
    let shape = Shape::new(vec![200, 50, 3, 3]).unwrap();
    assert_eq!(fans(&shape).unwrap(), (450, 1800));
    let std_of = |t: &Tensor<f64>| {
        let v = t.data();
        (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt()
    };
    let mut rng = init_rng(1);
    let kn = Init::KaimingNormal { a: 0.0 }
        .tensor::<f64>(&shape, &mut rng)
        .unwrap();
    assert!((std_of(&kn) / (2.0f64 / 450.0).sqrt() - 1.0).abs() < 0.02);
    let xu = Init::XavierUniform { gain: 1.0 }
        .tensor::<f64>(&shape, &mut rng)
        .unwrap();
    let b = (6.0f64 / 2250.0).sqrt();
    assert!(xu.data().iter().all(|x| x.abs() <= b));
    assert!((std_of(&xu) / (b / 3f64.sqrt()) - 1.0).abs() < 0.02);
    let xn = Init::XavierNormal { gain: 2.0 }
        .tensor::<f64>(&shape, &mut rng)
        .unwrap();
    assert!((std_of(&xn) / (2.0 * (2.0f64 / 2250.0).sqrt()) - 1.0).abs() < 0.02);
    assert!(fans(&Shape::new(vec![5]).unwrap()).is_err());
}

#[test]
fn same_seed_same_init_across_dtypes() {
    let a = Model::<f64>::new(&mlp(vec![8], 0.0), 3).unwrap();
    let b = Model::<f32>::new(&mlp(vec![8], 0.0), 3).unwrap();
    for (p, q) in a.params.iter().zip(b.params.iter()) {
        let rounded: Vec<f32> = p.value.data().iter().map(|&v| v as f32).collect();
        assert_eq!(rounded, q.value.data());
    }
}

#[test]
fn dropout_zeroes_and_scales_in_training_and_passes_through_in_eval() {
    let d = Dropout::new(0.25).unwrap();
    let mut s = Session::<f64>::new();
    let params = tapegrad_nn::ParamSet::new();
    let mut ctx = Ctx::new(&mut s, &params, Mode::Train, dropout_rng(0, 0)).unwrap();
    let x = ctx
        .session()
        .input(Tensor::ones(&Shape::new(vec![4000]).unwrap()));
    let y = d.forward(&mut ctx, x).unwrap();
    let v = ctx.session().value(y).unwrap().data().to_vec();
    assert!(v.iter().all(|&e| e == 0.0 || e == 1.0 / 0.75));
    let kept = v.iter().filter(|&&e| e != 0.0).count() as f64 / 4000.0;
    assert!((kept - 0.75).abs() < 0.03, "kept {kept}");
    let mut s2 = Session::<f64>::new();
    let mut eval = Ctx::new(&mut s2, &params, Mode::Eval, dropout_rng(0, 0)).unwrap();
    let x = eval
        .session()
        .input(Tensor::ones(&Shape::new(vec![10]).unwrap()));
    assert_eq!(d.forward(&mut eval, x).unwrap(), x);
    assert!(Dropout::new(1.0).is_err());
}

#[test]
fn schedules_follow_their_closed_forms() {
    let step = Schedule {
        warmup: 0,
        decay: Decay::Step {
            step_size: 10,
            gamma: 0.5,
        },
    };
    assert_eq!(
        [0, 9, 10, 25].map(|t| step.lr(0.8, t)),
        [0.8, 0.8, 0.4, 0.2]
    );
    let cos = Schedule {
        warmup: 0,
        decay: Decay::Cosine {
            t_max: 100,
            eta_min: 0.1,
        },
    };
    assert_eq!(cos.lr(1.0, 0), 1.0);
    assert!((cos.lr(1.0, 50) - 0.55).abs() < 1e-15);
    assert_eq!(cos.lr(1.0, 100), 0.1);
    assert_eq!(cos.lr(1.0, 500), 0.1);
    let warm = Schedule {
        warmup: 4,
        decay: Decay::Constant,
    };
    assert_eq!(
        [0, 1, 3, 4, 100].map(|t| warm.lr(1.0, t)),
        [0.2, 0.4, 0.8, 1.0, 1.0]
    );
    let warm_cos = Schedule {
        warmup: 2,
        decay: Decay::Cosine {
            t_max: 10,
            eta_min: 0.0,
        },
    };
    assert_eq!(
        warm_cos.lr(1.0, 2),
        1.0,
        "the decay starts at its own step 0 after warm-up"
    );
    // The longest warm-up there is: tiny, positive, finite rates (`warmup + 1` once wrapped
    // to 0 and gave an infinite rate).
    let endless = Schedule {
        warmup: u64::MAX,
        decay: Decay::Constant,
    };
    for t in [0, 1, 1 << 40, u64::MAX - 1] {
        let lr = endless.lr(1.0, t);
        assert!(lr > 0.0 && lr <= 1.0, "step {t}: {lr}");
    }
    assert_eq!(endless.lr(1.0, 0), 1.0 / 2f64.powi(64));
    assert!(Schedule {
        warmup: 0,
        decay: Decay::Step {
            step_size: 0,
            gamma: 0.5
        }
    }
    .validate()
    .is_err());
}

#[test]
fn clipping_scales_to_the_max_norm_and_leaves_small_gradients() {
    // Norms 3-4-5 and 12: global norm 13.
    let mut g = vec![
        Tensor::<f64>::from_f64(&[2], &[3.0, 4.0]).unwrap(),
        Tensor::from_f64(&[1], &[12.0]).unwrap(),
    ];
    let total = clip_grad_norm(&mut g, 6.5).unwrap();
    assert_eq!(total, 13.0);
    let coef = 6.5 / (13.0 + 1e-6);
    assert_eq!(g[0].data(), &[3.0 * coef, 4.0 * coef]);
    assert_eq!(g[1].data(), &[12.0 * coef]);
    assert!((global_norm(&g) - 6.5).abs() < 1e-6);
    let mut small = vec![Tensor::<f64>::from_f64(&[2], &[0.3, 0.4]).unwrap()];
    assert_eq!(clip_grad_norm(&mut small, 1.0).unwrap(), 0.5);
    assert_eq!(small[0].data(), &[0.3, 0.4]);
    assert!(clip_grad_norm(&mut small, 0.0).is_err());
}

#[test]
fn a_parameter_too_large_to_allocate_is_an_error_naming_its_shape() {
    // 2^56 elements: a valid shape, but no machine has the memory.
    let shape = Shape::new(vec![1 << 28, 1 << 28]).unwrap();
    for init in [Init::KaimingUniform { a: 0.0 }, Init::Constant(0.0)] {
        let err = init
            .tensor::<f32>(&shape, &mut init_rng(0))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("init") && err.contains("[268435456, 268435456]"),
            "{err}"
        );
    }
}
