//! Numeric kernels on contiguous row-major tensors: strided walks, broadcasting maps, reductions,
//! softmax, layout changes (permute, slice, concat), matmul on the `gemm` crate and the products
//! behind `linear`.

pub mod alloc;
pub mod broadcast;
pub mod causal_softmax;
pub mod conv;
pub mod exp;
pub mod gelu;
pub mod group_sum;
pub mod head_product;
mod isa;
pub(crate) mod lanes;
pub mod layout;
pub mod linear;
pub mod matmul;
pub mod par_map;
pub mod reduce;
pub mod softmax;
pub mod update;
mod vecmat;
mod walk;
mod workers;

pub use broadcast::{binary_map, broadcast_shape, broadcast_to, sum_to};
pub use isa::simd_level;
pub use layout::{concat, permute, slice, transpose};
pub use matmul::{
    batched_matmul, matmul, matvec_rows, num_threads, outer_product, set_num_threads,
};
pub use reduce::{
    column_sums, expand_reduced, max_axes, mean_axes, pairwise_span, pairwise_sum, pairwise_sum_by,
    pairwise_sums_by, reduced_shape, sum_axes,
};
pub use softmax::{cross_entropy_rows, exp_sum, log_softmax, softmax};
pub use vecmat::vecmat_rows;
pub(crate) use walk::strided_walk;
pub use workers::{for_each_band_mut, for_each_chunk_mut, for_each_part};
