//! The graph IR (DESIGN section 4): typed inputs, SSA nodes over a context, evaluation, JVP,
//! reference backprop over the whole context, lowering to a tape, and the saved (compiled) graph.
