//! The sizes and length of `tapegrad train gpt`'s preset, as named values that the command line
//! and `tapegrad bench gpt` only override. Its optimizer and schedule are [`super::GptConfig::preset`].

/// A GPT run's sizes, batch and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptPreset {
    pub layers: usize,
    pub heads: usize,
    /// The width of the residual stream.
    pub embd: usize,
    /// The window of characters the model reads.
    pub context: usize,
    /// The MLP's hidden width over `embd`.
    pub mlp_ratio: usize,
    pub batch_size: usize,
    pub steps: u64,
    /// The validation loss is evaluated every this many steps.
    pub eval_every: u64,
}

impl GptPreset {
    /// `tapegrad train gpt`: 4 layers, 4 heads, width 128, context 64, batch 32, 1500 steps,
    /// an evaluation every 250.
    pub const SHAKESPEARE: GptPreset = GptPreset {
        layers: 4,
        heads: 4,
        embd: 128,
        context: 64,
        mlp_ratio: 4,
        batch_size: 32,
        steps: 1500,
        eval_every: 250,
    };
}
