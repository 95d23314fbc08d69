//! Replacing values (strings, numbers) in a JSON text at given paths, keeping every
//! other byte (key order, spacing, number spelling) as it was.

use std::collections::HashMap;

use serde_json::Value;

/// One step of a path: an object key or an array index.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Seg {
    Key(String),
    Index(usize),
}

pub type Path = Vec<Seg>;

/// Writes `path` as `panels[2].targets[0].expr`.
pub fn show(path: &[Seg]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

#[derive(Debug, thiserror::Error)]
#[error("JSON at byte {at}: {msg}")]
pub struct EditError {
    at: usize,
    msg: &'static str,
}

/// `text` with the string value at each path of `edits` replaced by the new string.
pub fn replace_strings(text: &str, edits: &HashMap<Path, String>) -> Result<String, EditError> {
    let values: HashMap<Path, Value> = edits
        .iter()
        .map(|(p, s)| (p.clone(), Value::String(s.clone())))
        .collect();
    replace_values(text, &values)
}

/// `text` with the scalar (string, number, `null`) at each path of `edits` replaced by
/// the new value, written as compact JSON.
pub fn replace_values(text: &str, edits: &HashMap<Path, Value>) -> Result<String, EditError> {
    let mut w = Walker {
        s: text.as_bytes(),
        text,
        i: 0,
        out: String::with_capacity(text.len()),
        copied: 0,
        edits,
        path: Vec::new(),
    };
    w.ws();
    w.value()?;
    w.ws();
    if w.i != w.s.len() {
        return Err(w.err("text after the JSON value"));
    }
    w.out.push_str(&text[w.copied..]);
    Ok(w.out)
}

struct Walker<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
    out: String,
    copied: usize,
    edits: &'a HashMap<Path, Value>,
    path: Path,
}

impl Walker<'_> {
    fn err(&self, msg: &'static str) -> EditError {
        EditError { at: self.i, msg }
    }

    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn value(&mut self) -> Result<(), EditError> {
        match self.s.get(self.i) {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => {
                let start = self.i;
                self.string()?;
                self.replace(start);
                Ok(())
            }
            Some(_) => {
                let start = self.i;
                while self
                    .s
                    .get(self.i)
                    .is_some_and(|c| !matches!(c, b',' | b'}' | b']') && !c.is_ascii_whitespace())
                {
                    self.i += 1;
                }
                self.replace(start);
                Ok(())
            }
            None => Err(self.err("unexpected end")),
        }
    }

    /// The scalar that ends here and began at `start` is replaced when `edits` names it.
    fn replace(&mut self, start: usize) {
        if let Some(new) = self.edits.get(&self.path) {
            self.out.push_str(&self.text[self.copied..start]);
            self.out
                .push_str(&serde_json::to_string(new).unwrap_or_else(|_| "null".into()));
            self.copied = self.i;
        }
    }

    fn string(&mut self) -> Result<(), EditError> {
        self.i += 1;
        loop {
            match self.s.get(self.i) {
                None => return Err(self.err("unterminated string")),
                Some(b'\\') => self.i += 2,
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(_) => self.i += 1,
            }
        }
    }

    fn object(&mut self) -> Result<(), EditError> {
        self.i += 1;
        loop {
            self.ws();
            match self.s.get(self.i) {
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'"') => {}
                _ => return Err(self.err("expected a key")),
            }
            let start = self.i;
            self.string()?;
            let key: String =
                serde_json::from_str(&self.text[start..self.i]).map_err(|_| self.err("bad key"))?;
            self.ws();
            if self.s.get(self.i) != Some(&b':') {
                return Err(self.err("expected ':'"));
            }
            self.i += 1;
            self.ws();
            self.path.push(Seg::Key(key));
            self.value()?;
            self.path.pop();
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b'}') => {}
                _ => return Err(self.err("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self) -> Result<(), EditError> {
        self.i += 1;
        let mut n = 0;
        loop {
            self.ws();
            if self.s.get(self.i) == Some(&b']') {
                self.i += 1;
                return Ok(());
            }
            self.path.push(Seg::Index(n));
            self.value()?;
            self.path.pop();
            n += 1;
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b']') => {}
                _ => return Err(self.err("expected ',' or ']'")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_strings_change() {
        let text = "{\n  \"b\": 1.50,  \"a\": [ {\"expr\": \"x\\\"y\"}, {\"expr\": \"z\"} ],\n \"u\": \"ms\"\n}\n";
        let mut edits = HashMap::new();
        edits.insert(
            vec![Seg::Key("a".into()), Seg::Index(1), Seg::Key("expr".into())],
            "w\"v".to_string(),
        );
        edits.insert(vec![Seg::Key("u".into())], "s".to_string());
        let out = replace_strings(text, &edits).expect("valid JSON");
        assert_eq!(
            out,
            "{\n  \"b\": 1.50,  \"a\": [ {\"expr\": \"x\\\"y\"}, {\"expr\": \"w\\\"v\"} ],\n \"u\": \"s\"\n}\n"
        );
        assert_eq!(replace_strings(text, &HashMap::new()).expect("valid"), text);
    }

    #[test]
    fn numbers_and_nulls_are_replaced_too() {
        let text = "{\"steps\": [ {\"value\": null}, {\"value\": 80.50} ], \"max\": 1e3}";
        let mut edits = HashMap::new();
        let at = |i| {
            vec![
                Seg::Key("steps".into()),
                Seg::Index(i),
                Seg::Key("value".into()),
            ]
        };
        edits.insert(at(1), Value::from(84410368u64));
        edits.insert(vec![Seg::Key("max".into())], Value::from(0.5));
        let out = replace_values(text, &edits).expect("valid JSON");
        assert_eq!(
            out,
            "{\"steps\": [ {\"value\": null}, {\"value\": 84410368} ], \"max\": 0.5}"
        );
    }

    #[test]
    fn broken_json_is_an_error() {
        for t in ["{", "{\"a\" 1}", "[1,", "{\"a\": \"x}", "{} x"] {
            assert!(replace_strings(t, &HashMap::new()).is_err(), "{t}");
        }
    }
}
