//! Where the 2-thread split of a square n x n x n sgemm loses time: the whole product on one
//! thread, its row or column bands one after the other on one thread (what a band split adds in
//! duplicated packing, as time or, under `valgrind --tool=callgrind`, as instructions), gemm's own
//! Rayon split, and tapegrad's matmul. Interleaved rep by rep, so every variant sees the same
//! machine; min and median wall time in ms, and the process CPU time per rep (all threads).
//!
//! Usage: square-probe [--n 1024] [--threads 2] [--reps 20] [--only VARIANT]
//! VARIANT: whole, rows2, cols2, rows4 (bands one after the other on one thread), par-rowsB /
//! par-colsB for B in 2, 4, 8 (B bands claimed one at a time by `--threads` scoped threads),
//! rayon, mm (matrixmultiply, threading), faer, tapegrad; `--only` runs that variant only,
//! `--variants a,b,c` times only those, interleaved.

use gemm_peers::values;
use std::time::{Duration, Instant};

/// One way of computing the product, run once per call.
type Variant<'a> = Box<dyn FnMut() + 'a>;

fn process_cpu_time() -> Duration {
    gemm_peers::cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Row-major `dst[r0.., c0..]` (rows x cols of the n x n product, row stride n) computed as one
/// gemm call over rows r0.. of a and columns c0.. of b.
fn band(
    n: usize,
    (r0, rows): (usize, usize),
    (c0, cols): (usize, usize),
    dst: *mut f32,
    a: &[f32],
    b: &[f32],
    par: gemm::Parallelism,
) {
    assert!(r0 + rows <= n && c0 + cols <= n && a.len() == n * n && b.len() == n * n);
    // SAFETY: the assert keeps every index of the band inside the n x n operands and `dst`
    // (an n x n buffer, see the callers); callers run bands that write disjoint elements.
    unsafe {
        gemm::gemm(
            rows,
            cols,
            n,
            dst.add(r0 * n + c0),
            1,
            n as isize,
            false,
            a.as_ptr().add(r0 * n),
            1,
            n as isize,
            b.as_ptr().add(c0),
            1,
            n as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// Bands of the whole product claimed one by one (an atomic counter) by `threads` scoped threads,
/// so a thread that loses its core for a while leaves its unclaimed bands to the others.
fn par_bands(
    n: usize,
    parts: usize,
    by_rows: bool,
    threads: usize,
    dst: &mut [f32],
    a: &[f32],
    b: &[f32],
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Out(*mut f32);
    // SAFETY: bands write disjoint elements of `dst`, which outlives the scope.
    unsafe impl Sync for Out {}
    let out = Out(dst.as_mut_ptr());
    let (out, next) = (&out, AtomicUsize::new(0));
    let per = n.div_ceil(parts);
    let work = || loop {
        let p = next.fetch_add(1, Ordering::Relaxed);
        if p >= parts {
            return;
        }
        let s = (p * per, per.min(n - p * per));
        let (rows, cols) = if by_rows { (s, (0, n)) } else { ((0, n), s) };
        band(n, rows, cols, out.0, a, b, gemm::Parallelism::None);
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            scope.spawn(work);
        }
        work();
    });
}

fn main() {
    let (mut n, mut threads, mut reps, mut only) = (1024usize, 2usize, 20usize, None::<String>);
    let mut keep = None::<String>;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().expect("flag value");
        match flag.as_str() {
            "--n" => n = v.parse().unwrap(),
            "--threads" => threads = v.parse().unwrap(),
            "--reps" => reps = v.parse().unwrap(),
            "--only" => only = Some(v),
            "--variants" => keep = Some(v),
            f => panic!("unknown flag {f}"),
        }
    }
    tapegrad_tensor::kernels::set_num_threads(threads);
    std::env::set_var("MATMUL_NUM_THREADS", threads.to_string());
    let (a, b) = (values(n * n, 1), values(n * n, 2));
    let (a, b) = (&a[..], &b[..]);
    let ta = tapegrad_tensor::Tensor::new(&[n, n], a.to_vec()).unwrap();
    let tb = tapegrad_tensor::Tensor::new(&[n, n], b.to_vec()).unwrap();
    // One output buffer per variant, written in place every rep (as tapegrad's pool gives).
    let mut dst = vec![0.0f32; n * n];
    let (mut d1, mut d2, mut d3, mut d4) = (dst.clone(), dst.clone(), dst.clone(), dst.clone());
    let (mut d5, mut d6, mut d7) = (dst.clone(), dst.clone(), dst.clone());
    let (mut d8, mut d9, mut d10) = (dst.clone(), dst.clone(), dst.clone());
    let mut fc = faer::Mat::<f32>::zeros(n, n);
    let none = gemm::Parallelism::None;
    let bands = &|dst: &mut [f32], parts: usize, by_rows: bool| {
        let per = n.div_ceil(parts);
        for p in 0..parts {
            let s = (p * per, per.min(n - p * per));
            let (rows, cols) = if by_rows { (s, (0, n)) } else { ((0, n), s) };
            band(n, rows, cols, dst.as_mut_ptr(), a, b, none);
        }
    };
    let mut variants: Vec<(&str, Variant)> = vec![
        ("whole", Box::new(|| bands(&mut dst, 1, true))),
        ("rows2", Box::new(move || bands(&mut d1, 2, true))),
        ("cols2", Box::new(move || bands(&mut d2, 2, false))),
        ("rows4", Box::new(move || bands(&mut d3, 4, true))),
        (
            "rayon",
            Box::new(move || {
                band(
                    n,
                    (0, n),
                    (0, n),
                    d4.as_mut_ptr(),
                    a,
                    b,
                    gemm::Parallelism::Rayon(threads),
                )
            }),
        ),
        (
            "par-rows2",
            Box::new(move || par_bands(n, 2, true, threads, &mut d5, a, b)),
        ),
        (
            "par-rows4",
            Box::new(move || par_bands(n, 4, true, threads, &mut d6, a, b)),
        ),
        (
            "par-rows8",
            Box::new(move || par_bands(n, 8, true, threads, &mut d7, a, b)),
        ),
        (
            "par-cols2",
            Box::new(move || par_bands(n, 2, false, threads, &mut d8, a, b)),
        ),
        (
            "par-cols4",
            Box::new(move || par_bands(n, 4, false, threads, &mut d9, a, b)),
        ),
        (
            "mm",
            Box::new(move || gemm_peers::mm_square(n, a, b, &mut d10)),
        ),
        (
            "faer",
            Box::new(move || {
                let par = if threads > 1 {
                    faer::Par::rayon(threads)
                } else {
                    faer::Par::Seq
                };
                let (fa, fb) = (
                    faer::MatRef::from_row_major_slice(a, n, n),
                    faer::MatRef::from_row_major_slice(b, n, n),
                );
                faer::linalg::matmul::matmul(fc.as_mut(), faer::Accum::Replace, fa, fb, 1.0, par)
            }),
        ),
        (
            "tapegrad",
            Box::new(|| {
                std::hint::black_box(tapegrad_tensor::kernels::matmul(&ta, &tb).unwrap());
            }),
        ),
    ];
    if let Some(v) = only {
        let (_, f) = variants
            .iter_mut()
            .find(|(name, _)| *name == v)
            .unwrap_or_else(|| panic!("unknown variant {v}"));
        for _ in 0..reps {
            f();
        }
        return;
    }
    if let Some(keep) = keep {
        variants.retain(|(name, _)| keep.split(',').any(|k| k == *name));
    }
    let mut wall = vec![Vec::new(); variants.len()];
    let mut cpu = vec![Vec::new(); variants.len()];
    for rep in 0..reps + 2 {
        for (i, (_, f)) in variants.iter_mut().enumerate() {
            let (t, c) = (Instant::now(), process_cpu_time());
            f();
            if rep >= 2 {
                wall[i].push(t.elapsed().as_secs_f64() * 1e3);
                cpu[i].push((process_cpu_time() - c).as_secs_f64() * 1e3);
            }
        }
    }
    for (i, (name, _)) in variants.iter().enumerate() {
        let (w, c) = (&mut wall[i], &mut cpu[i]);
        w.sort_by(f64::total_cmp);
        c.sort_by(f64::total_cmp);
        println!(
            "n {n} threads {threads} {name:9} wall min {:7.2} med {:7.2} ms  cpu min {:7.2} med {:7.2} ms",
            w[0],
            w[w.len() / 2],
            c[0],
            c[c.len() / 2]
        );
    }
}
