//! The readable text form of a graph: one line per input and node, with shapes, attributes in
//! their graph-file spelling, which inputs require grad, and the output marked.

use super::file::write_attrs;
use super::{Graph, GraphNode};

/// `op(arg, ...; key=value, ...)` for node `n`.
fn call(g: &Graph, n: &GraphNode) -> String {
    let args: Vec<&str> = n.args.iter().map(|&a| g.name(a).unwrap_or("?")).collect();
    let mut text = format!("{}({}", n.op.name(), args.join(", "));
    match write_attrs(&n.op) {
        Ok(attrs) if !attrs.is_empty() => {
            let items: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            text.push_str(&format!("; {}", items.join(", ")));
        }
        Ok(_) => {}
        // An op without a file form still shows what its own Display knows.
        Err(_) => text = format!("{}({})", n.op, args.join(", ")),
    }
    text.push(')');
    text
}

/// The graph as text; `output` marks one slot.
pub fn render_text(g: &Graph, output: Option<usize>) -> String {
    let mut out = String::new();
    let mark = |slot: usize| {
        if output == Some(slot) {
            "   <- output"
        } else {
            ""
        }
    };
    for (i, x) in g.inputs().iter().enumerate() {
        out.push_str(&format!(
            "%{i} input {} : {}{}{}\n",
            x.name,
            x.shape,
            if x.requires_grad {
                " (requires grad)"
            } else {
                ""
            },
            mark(i)
        ));
    }
    let n_in = g.inputs().len();
    for (k, n) in g.nodes().iter().enumerate() {
        out.push_str(&format!(
            "%{} {} = {} : {}{}\n",
            n_in + k,
            n.name,
            call(g, n),
            n.shape,
            mark(n_in + k)
        ));
    }
    out
}

impl std::fmt::Display for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&render_text(self, None))
    }
}
