//! Reading a `tapegrad-graph/1` file: JSON syntax through serde_json, then every field checked by
//! hand so each error names the input or node it is about (unknown fields and ops, wrong data
//! lengths, duplicate names, references to later or missing names, bad attributes and shapes).

use super::numbers::{describe, integer, number, quote_decimals};
use super::{families, GraphFile, FORMAT};
use crate::graph::Graph;
use crate::{Error, OpError, Result};
use serde_json::{Map, Value};
use std::collections::HashSet;
use tapegrad_tensor::{DType, Shape};

const FILE: &str = "graph file";

fn invalid(message: impl Into<String>) -> Error {
    Error::invalid(FILE, message)
}

fn at(name: &str) -> impl Fn(Error) -> Error + '_ {
    move |e| e.at_node(format!("'{name}'"))
}

/// An object's fields, each checked against the allowed set.
fn fields<'a>(v: &'a Value, what: &str, allowed: &[&str]) -> Result<&'a Map<String, Value>> {
    let Value::Object(map) = v else {
        return Err(invalid(format!(
            "{what} must be a JSON object, found {}",
            describe(v)
        )));
    };
    if let Some(key) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(invalid(format!(
            "unknown field '{key}' in {what} (allowed: {})",
            allowed.join(", ")
        )));
    }
    Ok(map)
}

/// The `name` of an input or node, read first so that every later error can name it.
fn named<'a>(item: &'a Value, what: &str) -> Result<&'a str> {
    match item {
        Value::Object(m) => string(m, "name", what),
        v => Err(invalid(format!(
            "{what} must be a JSON object, found {}",
            describe(v)
        ))),
    }
}

fn string<'a>(map: &'a Map<String, Value>, key: &str, what: &str) -> Result<&'a str> {
    match map.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(invalid(format!(
            "{what}: '{key}' must be a string, found {}",
            describe(v)
        ))),
        None => Err(invalid(format!("{what}: '{key}' is missing"))),
    }
}

fn array<'a>(map: &'a Map<String, Value>, key: &str, what: &str) -> Result<&'a [Value]> {
    match map.get(key) {
        Some(Value::Array(items)) => Ok(items),
        Some(v) => Err(invalid(format!(
            "{what}: '{key}' must be a list, found {}",
            describe(v)
        ))),
        None => Err(invalid(format!("{what}: '{key}' is missing"))),
    }
}

fn shape(map: &Map<String, Value>, what: &str) -> Result<Shape> {
    let dims = array(map, "shape", what)?
        .iter()
        .map(|d| {
            integer(d)
                .and_then(|i| usize::try_from(i).ok())
                .ok_or_else(|| {
                    invalid(format!(
                        "{what}: a dimension must be a non-negative integer, found {}",
                        describe(d)
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    Shape::new(&dims).map_err(|_| invalid(format!("{what}: shape {dims:?} has too many elements")))
}

fn data(map: &Map<String, Value>, shape: &Shape, what: &str) -> Result<Vec<f64>> {
    let values = array(map, "data", what)?
        .iter()
        .map(|v| {
            number(v).ok_or_else(|| {
                invalid(format!(
                    "{what}: data must hold numbers, found {}",
                    describe(v)
                ))
            })
        })
        .collect::<Result<Vec<f64>>>()?;
    if values.len() != shape.numel() {
        return Err(Error::from(OpError::DataLength {
            op: FILE,
            len: values.len(),
            shape: Box::new(shape.clone()),
            numel: shape.numel(),
        }));
    }
    Ok(values)
}

/// Elements a file whose inputs hold `input_elements` may produce in all, inputs and every
/// node's value, so that a size written in a file (`broadcast_to`, padding, ...) cannot exhaust
/// memory or time. It depends on the data, not the text, so a written file parses back.
fn element_budget(input_elements: usize) -> usize {
    const MIN_ELEMENTS: usize = 1 << 20;
    const PER_INPUT_ELEMENT: usize = 256;
    input_elements
        .saturating_mul(PER_INPUT_ELEMENT)
        .max(MIN_ELEMENTS)
}

pub(super) fn parse(text: &str) -> Result<GraphFile> {
    // Syntax errors are reported on the original text, so their line and column are right.
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map_err(|e| invalid(format!("not valid JSON: {e}")))?;
    let root: Value = serde_json::from_str(&quote_decimals(text))
        .map_err(|e| invalid(format!("not valid JSON: {e}")))?;
    let top = fields(
        &root,
        "the file",
        &["format", "dtype", "inputs", "nodes", "output", "seed"],
    )?;
    let format = string(top, "format", "the file")?;
    if format != FORMAT {
        return Err(invalid(format!(
            "unsupported format '{format}' (this reader reads '{FORMAT}')"
        )));
    }
    let dtype = match top.get("dtype").map(|v| v.as_str()) {
        None | Some(Some("f64")) => DType::F64,
        Some(Some("f32")) => DType::F32,
        Some(_) => {
            return Err(invalid(format!(
                "'dtype' must be \"f32\" or \"f64\", found {}",
                describe(&top["dtype"])
            )))
        }
    };
    let mut graph = Graph::new();
    let mut input_data = Vec::new();
    for (i, item) in array(top, "inputs", "the file")?.iter().enumerate() {
        let (name, values) = parse_input(&mut graph, item, i)?;
        input_data.push(values);
        debug_assert_eq!(graph.slot_of(&name), Some(i));
    }
    let nodes = array(top, "nodes", "the file")?;
    let defined_later: HashSet<&str> = nodes
        .iter()
        .filter_map(|n| n.get("name").and_then(Value::as_str))
        .collect();
    let input_elements: usize = input_data.iter().map(Vec::len).sum();
    let budget = element_budget(input_elements);
    let mut elements = input_elements;
    for (k, item) in nodes.iter().enumerate() {
        parse_node(&mut graph, item, k, &defined_later)?;
        let slot = input_data.len() + k;
        let shape = graph.shape(slot)?;
        elements = elements.saturating_add(shape.numel());
        if elements > budget {
            return Err(invalid(format!(
                "shape {shape} brings the graph to {elements} elements; a file whose inputs hold {input_elements} may produce at most {budget} (256 per input element, at least {})",
                element_budget(0)
            ))
            .at_node(format!("'{}'", graph.name(slot)?)));
        }
    }
    let output = match top.get("output") {
        None => graph
            .last_slot()
            .map_err(|_| invalid("the graph has no inputs and no nodes"))?,
        Some(Value::String(name)) => graph.slot_of(name).ok_or_else(|| {
            invalid(format!(
                "'output' names '{name}', which is not an input or a node"
            ))
        })?,
        Some(v) => {
            return Err(invalid(format!(
                "'output' must be a name, found {}",
                describe(v)
            )))
        }
    };
    let seed = match top.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let out_name = graph.name(output)?.to_string();
            let seed_fields = fields(v, "the seed", &["shape", "data"]).map_err(at(&out_name))?;
            let s = shape(seed_fields, "the seed").map_err(at(&out_name))?;
            let expected = graph.shape(output)?;
            if s != *expected {
                return Err(invalid(format!(
                    "the seed has shape {s}, but the output has shape {expected}"
                ))
                .at_node(format!("'{out_name}'")));
            }
            Some(data(seed_fields, &s, "the seed").map_err(at(&out_name))?)
        }
    };
    Ok(GraphFile {
        dtype,
        graph,
        data: input_data,
        output,
        seed,
    })
}

fn parse_input(graph: &mut Graph, item: &Value, i: usize) -> Result<(String, Vec<f64>)> {
    let what = format!("input {i}");
    let name = named(item, &what)?;
    let in_input = at(name);
    let what = format!("input '{name}'");
    let map =
        fields(item, &what, &["name", "shape", "data", "requires_grad"]).map_err(&in_input)?;
    let s = shape(map, &what).map_err(&in_input)?;
    let values = data(map, &s, &what).map_err(&in_input)?;
    let requires_grad = match map.get("requires_grad") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(in_input(invalid(format!(
                "'requires_grad' must be true or false, found {}",
                describe(v)
            ))))
        }
    };
    graph.input(name, s, requires_grad)?;
    Ok((name.to_string(), values))
}

fn parse_node(
    graph: &mut Graph,
    item: &Value,
    k: usize,
    all_node_names: &HashSet<&str>,
) -> Result<()> {
    let what = format!("node {k}");
    let name = named(item, &what)?;
    let in_node = at(name);
    let what = format!("node '{name}'");
    let map = fields(item, &what, &["name", "op", "args", "attrs"]).map_err(&in_node)?;
    let op_name = string(map, "op", &what).map_err(&in_node)?;
    let mut args = Vec::new();
    for a in array(map, "args", &what).map_err(&in_node)? {
        let Value::String(arg) = a else {
            return Err(in_node(invalid(format!(
                "an argument must be the name of an input or node, found {}",
                describe(a)
            ))));
        };
        let slot = graph.slot_of(arg).ok_or_else(|| {
            in_node(invalid(if arg == name {
                format!("argument '{arg}' refers to the node itself")
            } else if all_node_names.contains(arg.as_str()) {
                format!("argument '{arg}' refers to a node defined later (nodes may only read earlier ones)")
            } else {
                format!("argument '{arg}' is not an input or an earlier node")
            }))
        })?;
        args.push(slot);
    }
    let attrs = match map.get("attrs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(v) => {
            return Err(in_node(invalid(format!(
                "'attrs' must be an object, found {}",
                describe(v)
            ))))
        }
    };
    let op = families::parse_op(op_name, args.len(), attrs).map_err(&in_node)?;
    graph.node(name, op, &args)?;
    Ok(())
}
