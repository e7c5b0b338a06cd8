//! The one list of ops: every op kind with its PyTorch name, family by family. `OpKind`, its
//! labels and families, `Op::kind`, every op struct's `name` and `into()` derive from it, and so
//! do the graph-file format's names and the law registry's kinds (hence `tapegrad check` and the
//! law tests, which iterate `OpKind::ALL`).

use super::nn::{self, NnOp};
use super::{loss, ActivationOp, ElementwiseOp, LinalgOp, LossOp, ReduceOp, StructureOp};

/// The kind of an op value (generated from the list for every family enum and op struct).
pub trait HasKind {
    /// The op's entry in the list.
    fn kind(&self) -> OpKind;
}

/// The pattern of one entry: the variant named like the kind, or the one the entry spells out.
macro_rules! variant_pattern {
    ($ty:ident, $kind:ident) => {
        $ty::$kind { .. }
    };
    ($ty:ident, $kind:ident = $variant:ident $pattern:tt) => {
        $ty::$variant $pattern
    };
}

/// For each op struct of a core family (`Family(FamilyEnum in module)`): its kind, and `From` into
/// its family enum and into `Op`. Not for an entry that spells out its variant: a struct holding
/// two kinds says which it is itself.
macro_rules! op_structs {
    ($family:ident($ty:ident) [$module:ident]) => {};
    ($family:ident($ty:ident) [$module:ident] $kind:ident = $variant:ident, $($rest:tt)*) => {
        op_structs!($family($ty) [$module] $($rest)*);
    };
    ($family:ident($ty:ident) [$module:ident] $kind:ident, $($rest:tt)*) => {
        impl HasKind for super::$module::$kind {
            #[inline]
            fn kind(&self) -> OpKind {
                OpKind::$kind
            }
        }

        impl From<super::$module::$kind> for $ty {
            fn from(op: super::$module::$kind) -> $ty {
                $ty::$kind(op)
            }
        }

        impl From<super::$module::$kind> for super::Op {
            fn from(op: super::$module::$kind) -> super::Op {
                super::Op::$family($ty::$kind(op))
            }
        }

        op_structs!($family($ty) [$module] $($rest)*);
    };
}

macro_rules! op_list {
    (
        core {
            $(
                $family:ident($ty:ident in $module:ident) {
                    $( $kind:ident $(= $variant:ident $pattern:tt)? => $label:literal, )*
                }
            )*
        }
        Nn(NnOp) { $( $nn:ident => $nn_label:literal, )* }
    ) => {
        /// Every op without its attributes, in the list's order. Each is one variant of its
        /// family's enum, except `binary_cross_entropy_with_logits`, whose form with a
        /// per-element `weight` is a kind of its own (its attribute variants and argument
        /// generators differ).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind {
            $($($kind,)*)*
            /// The neural-network family (`Op::Nn`).
            Nn(NnKind),
        }

        /// Every variant of the neural-network family (`NnOp`), without its attributes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum NnKind { $($nn,)* }

        /// The families of ops, one per variant of `Op`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum OpFamily { $($family,)* Nn }

        impl OpKind {
            /// Every kind, in the list's order (the nn family last).
            pub const ALL: &'static [OpKind] =
                &[$($(OpKind::$kind,)*)* $(OpKind::Nn(NnKind::$nn),)*];

            /// PyTorch's name of the op (what `Op::name` returns, and the graph-file name).
            #[inline]
            pub fn label(self) -> &'static str {
                match self {
                    $($(OpKind::$kind => $label,)*)*
                    OpKind::Nn(nn) => nn.label(),
                }
            }

            /// The family the op belongs to.
            pub fn family(self) -> OpFamily {
                match self {
                    $($(OpKind::$kind => OpFamily::$family,)*)*
                    OpKind::Nn(_) => OpFamily::Nn,
                }
            }
        }

        impl NnKind {
            /// PyTorch's name of the op.
            #[inline]
            pub fn label(self) -> &'static str {
                match self { $(NnKind::$nn => $nn_label,)* }
            }
        }

        // Exhaustive: a family variant missing from the list does not compile.
        $(
            impl HasKind for $ty {
                #[inline]
                fn kind(&self) -> OpKind {
                    match self {
                        $(variant_pattern!($ty, $kind $(= $variant $pattern)?)
                            => OpKind::$kind,)*
                    }
                }
            }
        )*

        $( op_structs!($family($ty) [$module] $($kind $(= $variant)?,)*); )*

        impl HasKind for NnOp {
            #[inline]
            fn kind(&self) -> OpKind {
                match self { $(NnOp::$nn(_) => OpKind::Nn(NnKind::$nn),)* }
            }
        }

        $(
            impl HasKind for nn::$nn {
                #[inline]
                fn kind(&self) -> OpKind {
                    OpKind::Nn(NnKind::$nn)
                }
            }

            impl From<nn::$nn> for NnOp {
                fn from(op: nn::$nn) -> NnOp {
                    NnOp::$nn(op)
                }
            }

            impl From<nn::$nn> for super::Op {
                fn from(op: nn::$nn) -> super::Op {
                    super::Op::Nn(Box::new(NnOp::$nn(op)))
                }
            }
        )*
    };
}

// One line per op: `Kind => "pytorch_name"`, in its family (`Family(FamilyEnum in module)`: each
// op a struct of `ops/module/`, held by the enum's variant of its name), the kind named as its
// struct and variant (or `Kind = Variant(pattern)` where one struct holds two kinds).
op_list! {
    core {
        Elementwise(ElementwiseOp in elementwise) {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            Neg => "neg",
            Scale => "scale",
            Abs => "abs",
            Sqrt => "sqrt",
            Exp => "exp",
            Log => "log",
            SafeLog => "safe_log",
            Sin => "sin",
            Cos => "cos",
            Pow => "pow",
            Clamp => "clamp",
            Maximum => "maximum",
            Minimum => "minimum",
            Where => "where",
        }
        Activation(ActivationOp in activation) {
            Relu => "relu",
            LeakyRelu => "leaky_relu",
            Sigmoid => "sigmoid",
            Tanh => "tanh",
            Gelu => "gelu",
            Softplus => "softplus",
            Silu => "silu",
        }
        Reduce(ReduceOp in reduce) {
            Sum => "sum",
            Mean => "mean",
            Amax => "amax",
            Softmax => "softmax",
            LogSoftmax => "log_softmax",
            LogSumExp => "logsumexp",
        }
        Linalg(LinalgOp in linalg) {
            Matmul => "matmul",
            Linear => "linear",
            Transpose => "transpose",
            Permute => "permute",
        }
        Structure(StructureOp in structure) {
            Reshape => "reshape",
            Flatten => "flatten",
            BroadcastTo => "broadcast_to",
            Concat => "concat",
            Slice => "slice",
        }
        Loss(LossOp in loss) {
            MseLoss => "mse_loss",
            CrossEntropy => "cross_entropy",
            BinaryCrossEntropyWithLogits = BinaryCrossEntropyWithLogits(
                loss::BinaryCrossEntropyWithLogits { weight: None, .. }
            ) => "binary_cross_entropy_with_logits",
            NllLoss => "nll_loss",
            CrossEntropyProbs => "cross_entropy_probs",
            WeightedBinaryCrossEntropyWithLogits = BinaryCrossEntropyWithLogits(
                loss::BinaryCrossEntropyWithLogits { weight: Some(_), .. }
            ) => "binary_cross_entropy_with_logits",
        }
    }
    // Each a struct of `ops/nn/` (implementing `OpRules`) and the `NnOp` variant of its name.
    Nn(NnOp) {
        Conv1d => "conv1d",
        Conv2d => "conv2d",
        MaxPool2d => "max_pool2d",
        AvgPool2d => "avg_pool2d",
        AdaptiveAvgPool2d => "adaptive_avg_pool2d",
        LayerNorm => "layer_norm",
        BatchNorm => "batch_norm",
        GroupNorm => "group_norm",
        Embedding => "embedding",
        IndexSelect => "index_select",
        Gather => "gather",
        ScatterAdd => "scatter_add",
        Select => "select",
        Dropout => "dropout",
        ScaledDotProductAttention => "scaled_dot_product_attention",
        QkvAttention => "qkv_attention",
    }
}
