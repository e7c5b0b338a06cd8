//! Where a 2-thread split of the MLP's batch-256 products loses time: each product timed whole
//! (one thread), as its row or column halves alone (one thread each: the ideal 2-thread time is
//! the slower half), under gemm's own Rayon split, and as tapegrad runs it. Min and median in us.
//!
//! Usage: split-probe [--threads T] [--reps N] [--batch B] [--only VARIANT]   (VARIANT for callgrind runs:
//! whole, rows, cols: one thread, N reps of that variant only, both halves one after the other;
//! `--product "dy^T x@784"` limits any mode but seq/axpy to one product, by name and fan-in)

use gemm_peers::values;
use std::time::Instant;

/// One row-major `dst (m x n) = op(a) op(b)` call of gemm, operands by (row, column) strides.
#[allow(clippy::too_many_arguments)]
fn gemm_call(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
    par: gemm::Parallelism,
) {
    assert!((m - 1) * dst_rs + n - 1 < dst.len());
    assert!((m - 1) * a_rs + (k - 1) * a_cs < a.len());
    assert!((k - 1) * b_rs + (n - 1) * b_cs < b.len());
    // SAFETY: the asserts bound every index; dst is uniquely borrowed.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            false,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// A product by strides: (name, m, n, k, a, a_rs, a_cs, b, b_rs, b_cs).
type Strided<'a> = (
    &'a str,
    usize,
    usize,
    usize,
    &'a [f32],
    usize,
    usize,
    &'a [f32],
    usize,
    usize,
);
/// A named product `op(a) op(b)` of tensors: (name, a, transpose a, b, transpose b).
type Named<'a> = (
    &'a str,
    &'a tapegrad_tensor::Tensor<f32>,
    bool,
    &'a tapegrad_tensor::Tensor<f32>,
    bool,
);

fn stats(mut xs: Vec<f64>) -> (f64, f64) {
    xs.sort_by(f64::total_cmp);
    (xs[0], xs[xs.len() / 2])
}

fn time(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..3 {
        f();
    }
    stats(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect(),
    )
}

fn main() {
    let mut threads = 2;
    let mut reps = 200;
    let mut only: Option<String> = None;
    let mut batch = 256;
    // `--product "x W^T@784"`: only that product (name @ fan_in), for per-product callgrind counts.
    let mut product: Option<String> = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().expect("flag value");
        match flag.as_str() {
            "--threads" => threads = v.parse().unwrap(),
            "--reps" => reps = v.parse().unwrap(),
            "--only" => only = Some(v),
            "--batch" => batch = v.parse().unwrap(),
            "--product" => product = Some(v),
            f => panic!("unknown flag {f}"),
        }
    }
    tapegrad_tensor::kernels::set_num_threads(threads);
    if only.as_deref() == Some("seq") {
        return seq(reps, threads, batch);
    }
    if only.as_deref() == Some("axpy") {
        return axpy(reps);
    }
    for (fan_in, fan_out) in [(784usize, 256usize), (256, 128)] {
        let x = values(batch * fan_in, 3);
        let w = values(fan_out * fan_in, 4);
        let dy = values(batch * fan_out, 5);
        let products: [Strided; 3] = [
            (
                "x W^T", batch, fan_out, fan_in, &x, fan_in, 1, &w, 1, fan_in,
            ),
            (
                "dy W", batch, fan_in, fan_out, &dy, fan_out, 1, &w, fan_in, 1,
            ),
            (
                "dy^T x", fan_out, fan_in, batch, &dy, 1, fan_out, &x, fan_in, 1,
            ),
        ];
        for (name, m, n, k, a, a_rs, a_cs, b, b_rs, b_cs) in products {
            if product
                .as_deref()
                .is_some_and(|p| p != format!("{name}@{fan_in}"))
            {
                continue;
            }
            let mut dst = vec![0.0f32; m * n];
            let none = gemm::Parallelism::None;
            let whole = |dst: &mut [f32], par| {
                gemm_call(m, n, k, dst, n, a, a_rs, a_cs, b, b_rs, b_cs, par)
            };
            let (mh, nh) = (m / 2, n / 2);
            let row_band = |dst: &mut [f32], r0: usize, rows: usize| {
                gemm_call(
                    rows,
                    n,
                    k,
                    &mut dst[r0 * n..],
                    n,
                    &a[r0 * a_rs..],
                    a_rs,
                    a_cs,
                    b,
                    b_rs,
                    b_cs,
                    none,
                )
            };
            let col_band = |buf: &mut [f32], c0: usize, cols: usize| {
                gemm_call(
                    m,
                    cols,
                    k,
                    buf,
                    cols,
                    a,
                    a_rs,
                    a_cs,
                    &b[c0 * b_cs..],
                    b_rs,
                    b_cs,
                    none,
                )
            };
            let mut buf = vec![0.0f32; m * n];
            match only.as_deref() {
                Some("whole") => {
                    for _ in 0..reps {
                        whole(&mut dst, none);
                    }
                    continue;
                }
                Some("rows") => {
                    for _ in 0..reps {
                        row_band(&mut dst, 0, mh);
                        row_band(&mut dst, mh, m - mh);
                    }
                    continue;
                }
                Some("cols") => {
                    for _ in 0..reps {
                        col_band(&mut buf, 0, nh);
                        col_band(&mut buf, nh, n - nh);
                    }
                    continue;
                }
                Some(v) => panic!("unknown variant {v}"),
                None => {}
            }
            let w1 = time(reps, || whole(&mut dst, none));
            let r0 = time(reps, || row_band(&mut dst, 0, mh));
            let r1 = time(reps, || row_band(&mut dst, mh, m - mh));
            let c0 = time(reps, || col_band(&mut buf, 0, nh));
            let c1 = time(reps, || col_band(&mut buf, nh, n - nh));
            let gr = time(reps, || whole(&mut dst, gemm::Parallelism::Rayon(threads)));
            let ta = tapegrad_tensor::Tensor::new(
                &[
                    a.len() / (if a_cs == 1 { a_rs } else { a_cs }),
                    if a_cs == 1 { a_rs } else { a_cs },
                ],
                a.to_vec(),
            )
            .unwrap();
            let tb = tapegrad_tensor::Tensor::new(
                &[
                    b.len() / (if b_cs == 1 { b_rs } else { b_cs }),
                    if b_cs == 1 { b_rs } else { b_cs },
                ],
                b.to_vec(),
            )
            .unwrap();
            let (trans_a, trans_b) = (a_cs != 1, b_cs != 1);
            let tg = time(reps, || {
                std::hint::black_box(
                    tapegrad_tensor::kernels::batched_matmul(&ta, trans_a, &tb, trans_b).unwrap(),
                );
            });
            println!(
                "{name:7} {m:4}x{n:4}x{k:4}  whole {:7.1} ({:7.1})  rows {:6.1}+{:6.1}  cols {:6.1}+{:6.1}  gemm-rayon{threads} {:7.1} ({:7.1})  tapegrad-t{threads} {:7.1} ({:7.1})",
                w1.0, w1.1, r0.0, r1.0, c0.0, c1.0, gr.0, gr.1, tg.0, tg.1
            );
        }
    }
}

/// `p += a * g` over the MLP's first weight (200,704 elements): one thread vs split over the
/// GEMM threads, alternating rep by rep so that both see the same machine.
fn axpy(reps: usize) {
    use tapegrad_tensor::kernels::for_each_chunk_mut;
    let mut p = values(784 * 256, 1);
    let g = values(784 * 256, 2);
    let serial = |p: &mut [f32]| {
        for (p, &g) in p.iter_mut().zip(&g) {
            *p += -0.01 * g;
        }
    };
    let (mut one, mut split) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        serial(&mut p);
        one.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        for_each_chunk_mut(&mut p, 1 << 15, |start, p| {
            for (p, &g) in p.iter_mut().zip(&g[start..]) {
                *p += -0.01 * g;
            }
        });
        split.push(t.elapsed().as_secs_f64() * 1e6);
        // Something serial in between, as in a training step.
        std::hint::black_box(values(2000, 7));
    }
    let (a, b) = (stats(one), stats(split));
    println!(
        "axpy 200704: one thread {:.1} ({:.1}) us, split {:.1} ({:.1}) us (min (median))",
        a.0, a.1, b.0, b.1
    );
}

/// The five largest products of an MLP step (batch 256 unless `--batch`) in step order, each timed, with a little
/// serial work between them; at 1 thread, then at `threads`.
fn seq(reps: usize, threads: usize, batch: usize) {
    use tapegrad_tensor::kernels::{batched_matmul, set_num_threads};
    use tapegrad_tensor::Tensor;
    let t = |r: usize, c: usize, seed| Tensor::new(&[r, c], values(r * c, seed)).unwrap();
    let (x, w1, w2) = (t(batch, 784, 1), t(256, 784, 2), t(128, 256, 3));
    let (h1, g2, g1) = (t(batch, 256, 4), t(batch, 128, 5), t(batch, 256, 6));
    let products: [Named; 5] = [
        ("L1 x W^T", &x, false, &w1, true),
        ("L2 h W^T", &h1, false, &w2, true),
        ("L2 g^T h", &g2, true, &h1, false),
        ("L2 g W", &g2, false, &w2, false),
        ("L1 g^T x", &g1, true, &x, false),
    ];
    let mut times = vec![(Vec::new(), Vec::new()); products.len()];
    // All 1-thread steps first: alternating step by step would let the helpers fall asleep
    // between 2-thread steps, which a training loop does not.
    for th in [1, threads] {
        set_num_threads(th);
        for _ in 0..reps {
            for (i, &(_, a, ta, b, tb)) in products.iter().enumerate() {
                std::hint::black_box(values(20000, 9));
                let s = Instant::now();
                std::hint::black_box(batched_matmul(a, ta, b, tb).unwrap());
                let us = s.elapsed().as_secs_f64() * 1e6;
                if th == 1 {
                    times[i].0.push(us)
                } else {
                    times[i].1.push(us)
                }
            }
        }
    }
    let (mut s1, mut s2) = (0.0, 0.0);
    for (i, (one, many)) in times.into_iter().enumerate() {
        let (a, b) = (stats(one), stats(many));
        s1 += a.0;
        s2 += b.0;
        println!("{:10} 1 thread {:7.1} ({:7.1})  {threads} threads {:7.1} ({:7.1})  ratio of mins {:.2}", products[i].0, a.0, a.1, b.0, b.1, a.0 / b.0);
    }
    println!("sum of mins: {s1:.0} vs {s2:.0} us");
}
