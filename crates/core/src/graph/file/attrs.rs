//! Node attributes in graph files: `Attrs` reads them with PyTorch's argument names and typed
//! checks (every key must be asked for, so an unknown attribute is an error), `AttrWriter` writes
//! them back. One family file per op family maps op names to `Op` values and back.

use super::numbers::{describe, format_f64, integer, number};
use crate::ops::nn::IndexTensor;
use crate::ops::Mask;
use crate::{Error, Result};
use serde_json::{Map, Value};

/// The attributes of one node, consumed key by key.
pub struct Attrs {
    op: &'static str,
    map: Map<String, Value>,
    known: Vec<&'static str>,
}

impl Attrs {
    /// Attributes `map` of a node whose op is `op`.
    pub fn new(op: &'static str, map: Map<String, Value>) -> Self {
        Attrs {
            op,
            map,
            known: Vec::new(),
        }
    }

    /// The op these attributes belong to.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// Removes `key`; `null` counts as absent.
    pub fn take(&mut self, key: &'static str) -> Option<Value> {
        self.known.push(key);
        self.map.remove(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, expected: &str, v: &Value) -> Error {
        Error::invalid(
            self.op,
            format!(
                "attribute '{key}' must be {expected}, found {}",
                describe(v)
            ),
        )
    }

    fn missing(&self, key: &str) -> Error {
        Error::invalid(self.op, format!("attribute '{key}' is required"))
    }

    /// An optional number.
    pub fn f64(&mut self, key: &'static str) -> Result<Option<f64>> {
        self.take(key)
            .map(|v| number(&v).ok_or_else(|| self.wrong(key, "a number", &v)))
            .transpose()
    }

    /// A number, or `default` when absent.
    pub fn f64_or(&mut self, key: &'static str, default: f64) -> Result<f64> {
        Ok(self.f64(key)?.unwrap_or(default))
    }

    /// A required number.
    pub fn f64_req(&mut self, key: &'static str) -> Result<f64> {
        self.f64(key)?.ok_or_else(|| self.missing(key))
    }

    /// A boolean, or `default` when absent.
    pub fn bool_or(&mut self, key: &'static str, default: bool) -> Result<bool> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(v) => Err(self.wrong(key, "true or false", &v)),
        }
    }

    fn to_isize(&self, key: &str, v: &Value) -> Result<isize> {
        integer(v)
            .and_then(|i| isize::try_from(i).ok())
            .ok_or_else(|| self.wrong(key, "an integer", v))
    }

    fn to_usize(&self, key: &str, v: &Value) -> Result<usize> {
        integer(v)
            .and_then(|i| usize::try_from(i).ok())
            .ok_or_else(|| self.wrong(key, "a non-negative integer", v))
    }

    /// An optional integer (an axis, a bound).
    pub fn isize(&mut self, key: &'static str) -> Result<Option<isize>> {
        self.take(key).map(|v| self.to_isize(key, &v)).transpose()
    }

    /// An integer, or `default` when absent.
    pub fn isize_or(&mut self, key: &'static str, default: isize) -> Result<isize> {
        Ok(self.isize(key)?.unwrap_or(default))
    }

    /// A required integer.
    pub fn isize_req(&mut self, key: &'static str) -> Result<isize> {
        self.isize(key)?.ok_or_else(|| self.missing(key))
    }

    /// An optional non-negative integer.
    pub fn usize(&mut self, key: &'static str) -> Result<Option<usize>> {
        self.take(key).map(|v| self.to_usize(key, &v)).transpose()
    }

    /// A non-negative integer, or `default` when absent.
    pub fn usize_or(&mut self, key: &'static str, default: usize) -> Result<usize> {
        Ok(self.usize(key)?.unwrap_or(default))
    }

    /// A 64-bit unsigned integer (a seed), or `default` when absent.
    pub fn u64_or(&mut self, key: &'static str, default: u64) -> Result<u64> {
        match self.take(key) {
            None => Ok(default),
            // Integers of more than 18 digits arrive as text (see `numbers::quote_decimals`).
            Some(v) => match &v {
                Value::String(s) => s.parse::<u64>().ok(),
                other => other.as_u64(),
            }
            .ok_or_else(|| self.wrong(key, "a non-negative integer", &v)),
        }
    }

    /// A required non-negative integer.
    pub fn usize_req(&mut self, key: &'static str) -> Result<usize> {
        self.usize(key)?.ok_or_else(|| self.missing(key))
    }

    fn list(&self, key: &str, v: Value) -> Result<Vec<Value>> {
        match v {
            Value::Array(items) => Ok(items),
            other => Err(self.wrong(key, "a list", &other)),
        }
    }

    /// An optional list of numbers (class weights).
    pub fn f64s(&mut self, key: &'static str) -> Result<Option<Vec<f64>>> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        let items = self.list(key, v)?;
        items
            .iter()
            .map(|v| number(v).ok_or_else(|| self.wrong(key, "a list of numbers", v)))
            .collect::<Result<_>>()
            .map(Some)
    }

    /// An optional list of integers (axes, dims, a shape with -1).
    pub fn isizes(&mut self, key: &'static str) -> Result<Option<Vec<isize>>> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        let items = self.list(key, v)?;
        items
            .iter()
            .map(|v| self.to_isize(key, v))
            .collect::<Result<_>>()
            .map(Some)
    }

    /// A required list of integers.
    pub fn isizes_req(&mut self, key: &'static str) -> Result<Vec<isize>> {
        self.isizes(key)?.ok_or_else(|| self.missing(key))
    }

    /// An optional list of non-negative integers (a shape, class labels).
    pub fn usizes(&mut self, key: &'static str) -> Result<Option<Vec<usize>>> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        let items = self.list(key, v)?;
        items
            .iter()
            .map(|v| self.to_usize(key, v))
            .collect::<Result<_>>()
            .map(Some)
    }

    /// A required list of non-negative integers.
    pub fn usizes_req(&mut self, key: &'static str) -> Result<Vec<usize>> {
        self.usizes(key)?.ok_or_else(|| self.missing(key))
    }

    /// An optional pair of non-negative integers, written `[a, b]` (a single integer means both),
    /// as PyTorch's `stride`, `padding`, `dilation` and `kernel_size`.
    pub fn usize_pair(&mut self, key: &'static str) -> Result<Option<[usize; 2]>> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        if let Value::Array(items) = &v {
            if items.len() != 2 {
                return Err(self.wrong(key, "a two-element list", &v));
            }
            return Ok(Some([
                self.to_usize(key, &items[0])?,
                self.to_usize(key, &items[1])?,
            ]));
        }
        let n = self.to_usize(key, &v)?;
        Ok(Some([n, n]))
    }

    /// A pair, or `default` when absent.
    pub fn usize_pair_or(&mut self, key: &'static str, default: [usize; 2]) -> Result<[usize; 2]> {
        Ok(self.usize_pair(key)?.unwrap_or(default))
    }

    /// A required pair.
    pub fn usize_pair_req(&mut self, key: &'static str) -> Result<[usize; 2]> {
        self.usize_pair(key)?.ok_or_else(|| self.missing(key))
    }

    /// Required indices: a list of non-negative integers (1-D), or
    /// `{"shape": [...], "data": [...]}` for any shape.
    pub fn indices_req(&mut self, key: &'static str) -> Result<IndexTensor> {
        let v = self.take(key).ok_or_else(|| self.missing(key))?;
        let expected = "a list of indices or an object {\"shape\": [...], \"data\": [...]}";
        let (shape, data) = match &v {
            Value::Array(items) => (vec![items.len()], items.as_slice()),
            Value::Object(m) => match (m.get("shape"), m.get("data"), m.len()) {
                (Some(Value::Array(dims)), Some(Value::Array(items)), 2) => {
                    let dims = dims
                        .iter()
                        .map(|d| self.to_usize(key, d))
                        .collect::<Result<Vec<_>>>()?;
                    (dims, items.as_slice())
                }
                _ => return Err(self.wrong(key, expected, &v)),
            },
            _ => return Err(self.wrong(key, expected, &v)),
        };
        let data = data
            .iter()
            .map(|d| self.to_usize(key, d))
            .collect::<Result<Vec<_>>>()?;
        IndexTensor::new(&shape, data)
            .map_err(|e| Error::invalid(self.op, format!("attribute '{key}': {e}")))
    }

    /// One of `options` (a string), or `default` when absent.
    pub fn choice(
        &mut self,
        key: &'static str,
        options: &[&'static str],
        default: &'static str,
    ) -> Result<&'static str> {
        let Some(v) = self.take(key) else {
            return Ok(default);
        };
        let found = v.as_str().and_then(|s| options.iter().find(|&&o| o == s));
        found.copied().ok_or_else(|| {
            let quoted: Vec<String> = options.iter().map(|o| format!("\"{o}\"")).collect();
            self.wrong(key, &format!("one of {}", quoted.join(", ")), &v)
        })
    }

    /// A required boolean mask (see [`Attrs::mask`]).
    pub fn mask_req(&mut self, key: &'static str) -> Result<Mask> {
        self.mask(key)?.ok_or_else(|| self.missing(key))
    }

    /// An optional boolean mask written `{"shape": [...], "data": [true, false, ...]}` (0 and 1
    /// accepted).
    pub fn mask(&mut self, key: &'static str) -> Result<Option<Mask>> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        let expected = "an object {\"shape\": [...], \"data\": [...]}";
        let Value::Object(m) = &v else {
            return Err(self.wrong(key, expected, &v));
        };
        let shape = match m.get("shape") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|d| self.to_usize(key, d))
                .collect::<Result<Vec<_>>>()?,
            _ => return Err(self.wrong(key, expected, &v)),
        };
        let data = match m.get("data") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|d| match d {
                    Value::Bool(b) => Ok(*b),
                    other => match integer(other) {
                        Some(0) => Ok(false),
                        Some(1) => Ok(true),
                        _ => Err(self.wrong(key, "a list of booleans", other)),
                    },
                })
                .collect::<Result<Vec<_>>>()?,
            _ => return Err(self.wrong(key, expected, &v)),
        };
        if m.len() != 2 {
            return Err(self.wrong(key, expected, &v));
        }
        Mask::new(&shape, data)
            .map(Some)
            .map_err(|e| Error::invalid(self.op, format!("attribute '{key}': {e}")))
    }

    /// Fails on any attribute that no reader asked for.
    pub fn finish(self) -> Result<()> {
        if let Some(key) = self.map.keys().next() {
            let takes = if self.known.is_empty() {
                "no attributes".to_string()
            } else {
                self.known.join(", ")
            };
            return Err(Error::invalid(
                self.op,
                format!("unknown attribute '{key}' ({} takes: {takes})", self.op),
            ));
        }
        Ok(())
    }
}

/// Attributes of one op as `(name, JSON text)` pairs, in a fixed order.
#[derive(Debug, Default)]
pub struct AttrWriter {
    pub entries: Vec<(&'static str, String)>,
}

impl AttrWriter {
    /// A number.
    pub fn f64(&mut self, key: &'static str, v: f64) {
        self.entries.push((key, format_f64(v)));
    }

    /// A number when present.
    pub fn opt_f64(&mut self, key: &'static str, v: Option<f64>) {
        if let Some(v) = v {
            self.f64(key, v);
        }
    }

    /// A boolean.
    pub fn bool(&mut self, key: &'static str, v: bool) {
        self.entries.push((key, v.to_string()));
    }

    /// An integer.
    pub fn int(&mut self, key: &'static str, v: impl std::fmt::Display) {
        self.entries.push((key, v.to_string()));
    }

    /// A list of numbers.
    pub fn floats(&mut self, key: &'static str, v: &[f64]) {
        let items: Vec<String> = v.iter().map(|&x| format_f64(x)).collect();
        self.entries.push((key, format!("[{}]", items.join(", "))));
    }

    /// A list of integers.
    pub fn ints<T: std::fmt::Display>(&mut self, key: &'static str, v: &[T]) {
        let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
        self.entries.push((key, format!("[{}]", items.join(", "))));
    }

    /// A string.
    pub fn str(&mut self, key: &'static str, v: &str) {
        self.entries
            .push((key, Value::String(v.to_string()).to_string()));
    }

    /// A pair as a two-element list.
    pub fn pair(&mut self, key: &'static str, v: [usize; 2]) {
        self.ints(key, &v);
    }

    /// Indices: a plain list when 1-D, else `{"shape": [...], "data": [...]}`.
    pub fn indices(&mut self, key: &'static str, ix: &IndexTensor) {
        let data: Vec<String> = ix.data.iter().map(|i| i.to_string()).collect();
        let list = format!("[{}]", data.join(", "));
        let text = if ix.shape.rank() == 1 {
            list
        } else {
            let dims: Vec<String> = ix.shape.dims().iter().map(|d| d.to_string()).collect();
            format!("{{\"shape\": [{}], \"data\": {list}}}", dims.join(", "))
        };
        self.entries.push((key, text));
    }

    /// A mask as `{"shape": [...], "data": [...]}`.
    pub fn mask(&mut self, key: &'static str, m: &Mask) {
        let dims: Vec<String> = m.shape.dims().iter().map(|d| d.to_string()).collect();
        let data: Vec<&str> = m
            .data
            .iter()
            .map(|&b| if b { "true" } else { "false" })
            .collect();
        self.entries.push((
            key,
            format!(
                "{{\"shape\": [{}], \"data\": [{}]}}",
                dims.join(", "),
                data.join(", ")
            ),
        ));
    }
}

/// The error for an op the file format cannot write yet.
pub fn not_writable(op: &str) -> Error {
    Error::invalid(
        "graph file",
        format!(
            "op '{op}' has no graph-file form yet (add it to its family in graph/file/families)"
        ),
    )
}
