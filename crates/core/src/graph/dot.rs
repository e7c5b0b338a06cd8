//! Graphviz DOT export of a graph: inputs as boxes (filled when they require grad), nodes as
//! ellipses labelled with name, op and shape, edges labelled with the argument position when a
//! node has more than one argument, and the output drawn with a double border.

use super::Graph;

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The graph in DOT; `output` gets a double border.
pub fn to_dot(g: &Graph, output: Option<usize>) -> String {
    let mut out =
        String::from("digraph tapegrad {\n  rankdir=TB;\n  node [fontname=\"Helvetica\"];\n");
    let border = |slot: usize| {
        if output == Some(slot) {
            ", peripheries=2"
        } else {
            ""
        }
    };
    for (i, x) in g.inputs().iter().enumerate() {
        let fill = if x.requires_grad {
            ", style=filled, fillcolor=\"#cfe2ff\""
        } else {
            ""
        };
        out.push_str(&format!(
            "  s{i} [shape=box, label=\"{}\\n{}\"{fill}{}];\n",
            escape(&x.name),
            x.shape,
            border(i)
        ));
    }
    let n_in = g.inputs().len();
    for (k, n) in g.nodes().iter().enumerate() {
        let slot = n_in + k;
        out.push_str(&format!(
            "  s{slot} [shape=ellipse, label=\"{} = {}\\n{}\"{}];\n",
            escape(&n.name),
            escape(n.op.name()),
            n.shape,
            border(slot)
        ));
        for (pos, &a) in n.args.iter().enumerate() {
            if n.args.len() > 1 {
                out.push_str(&format!("  s{a} -> s{slot} [label=\"{pos}\"];\n"));
            } else {
                out.push_str(&format!("  s{a} -> s{slot};\n"));
            }
        }
    }
    out.push_str("}\n");
    out
}
