//! Writing a `tapegrad-graph/1` file: one input or node per line, numbers in shortest round-trip
//! form, attributes in the order their family writes them, so the text parses back unchanged.

use super::numbers::format_f64;
use super::{families, GraphFile, FORMAT};
use crate::{Error, OpError, Result};
use serde_json::Value;

fn quote(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

fn numbers(values: &[f64]) -> String {
    let items: Vec<String> = values.iter().map(|&v| format_f64(v)).collect();
    format!("[{}]", items.join(", "))
}

fn dims(d: &[usize]) -> String {
    let items: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}

pub(super) fn write(file: &GraphFile) -> Result<String> {
    let g = &file.graph;
    if file.data.len() != g.inputs().len() {
        return Err(Error::invalid(
            "graph file",
            format!(
                "{} data lists for {} inputs",
                file.data.len(),
                g.inputs().len()
            ),
        ));
    }
    for (x, d) in g.inputs().iter().zip(&file.data) {
        if d.len() != x.shape.numel() {
            return Err(Error::from(OpError::DataLength {
                op: "graph file",
                len: d.len(),
                shape: Box::new(x.shape.clone()),
                numel: x.shape.numel(),
            })
            .at_node(format!("'{}'", x.name)));
        }
    }
    let mut out = String::new();
    out.push_str(&format!(
        "{{\"format\": {}, \"dtype\": {},\n \"inputs\": [",
        quote(FORMAT),
        quote(file.dtype.name())
    ));
    for (i, (x, d)) in g.inputs().iter().zip(&file.data).enumerate() {
        out.push_str(if i == 0 { "\n  " } else { ",\n  " });
        out.push_str(&format!(
            "{{\"name\": {}, \"shape\": {}, \"data\": {}, \"requires_grad\": {}}}",
            quote(&x.name),
            dims(x.shape.dims()),
            numbers(d),
            x.requires_grad
        ));
    }
    out.push_str("],\n \"nodes\": [");
    for (k, n) in g.nodes().iter().enumerate() {
        out.push_str(if k == 0 { "\n  " } else { ",\n  " });
        let args: Vec<String> = n
            .args
            .iter()
            .map(|&a| g.name(a).map(quote))
            .collect::<Result<_>>()?;
        out.push_str(&format!(
            "{{\"name\": {}, \"op\": {}, \"args\": [{}]",
            quote(&n.name),
            quote(n.op.name()),
            args.join(", ")
        ));
        let attrs = families::write_attrs(&n.op).map_err(|e| e.at_node(format!("'{}'", n.name)))?;
        if !attrs.is_empty() {
            let items: Vec<String> = attrs
                .iter()
                .map(|(k, v)| format!("{}: {v}", quote(k)))
                .collect();
            out.push_str(&format!(", \"attrs\": {{{}}}", items.join(", ")));
        }
        out.push('}');
    }
    out.push_str(&format!("],\n \"output\": {}", quote(g.name(file.output)?)));
    if let Some(seed) = &file.seed {
        out.push_str(&format!(
            ",\n \"seed\": {{\"shape\": {}, \"data\": {}}}",
            dims(g.shape(file.output)?.dims()),
            numbers(seed)
        ));
    }
    out.push_str("}\n");
    Ok(out)
}
