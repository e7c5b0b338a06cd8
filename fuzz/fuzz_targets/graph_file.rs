//! Graph files from arbitrary bytes: parse, write back, then value and gradients by all three
//! sweeps in f64 and f32. Property: an `Err` or a consistent result (the file round-trips; the
//! reference and saved sweeps agree bit for bit, as law 4 says), never a panic, OOM or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tapegrad_core::graph::{GraphFile, Sweep};
use tapegrad_core::{Scalar, Tensor};

fn same<S: Scalar>(a: &Tensor<S>, b: &Tensor<S>) -> bool {
    a.shape() == b.shape()
        && a.data()
            .iter()
            .zip(b.data())
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

fn sweeps<S: Scalar>(file: &GraphFile) {
    let (Ok(inputs), Ok(seed)) = (file.inputs::<S>(), file.seed::<S>()) else {
        return;
    };
    let results: Vec<_> = Sweep::ALL
        .iter()
        .map(|&s| file.graph.gradients(&inputs, file.output, &seed, s))
        .collect();
    for r in results.iter().flatten() {
        assert_eq!(r.output.shape(), file.graph.shape(file.output).unwrap());
        for (name, g) in &r.grads {
            let slot = file.graph.slot_of(name).unwrap();
            assert_eq!(
                g.shape(),
                file.graph.shape(slot).unwrap(),
                "gradient of {name}"
            );
        }
    }
    if let [_, Ok(reference), Ok(saved)] = &results[..] {
        assert!(same(&reference.output, &saved.output), "outputs differ");
        assert_eq!(reference.grads.len(), saved.grads.len());
        for ((n, r), (_, s)) in reference.grads.iter().zip(&saved.grads) {
            assert!(
                same(r, s),
                "reference and saved gradients of {n} differ: {r:?} vs {s:?}"
            );
        }
    }
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let Ok(file) = GraphFile::parse(text) else {
        return;
    };
    if let Ok(written) = file.to_json() {
        let back = GraphFile::parse(&written).expect("written graph file parses");
        assert_eq!(back, file, "graph file does not round-trip");
    }
    sweeps::<f64>(&file);
    sweeps::<f32>(&file);
});
