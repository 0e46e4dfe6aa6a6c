//! gymtrace's native reader: the summary readers' span filter (`gymtrace._read.source.summary_filter`)
//! run over a whole line of a trace file in compiled code.
//!
//! A line is one OTLP/JSON export request of up to a few hundred spans, nearly all of which the
//! summary readers drop after reading a few fields (a model call's output tokens, a step's part of
//! its episode's time split, the span's end). Parsing each span into Python objects only to drop it
//! was most of a reader's time. `Reducer.reduce` parses the line here, takes those fields of every
//! span it can drop, and returns the line with only the other spans in it, which Python then reads
//! as before (its own filter included). Whatever is not exactly as gymtrace writes it — a value
//! that is not plain, a key twice, a field of another type, a line that is not JSON — is left in
//! the line (or the line returned as it came), so the Python reader decides, reads or names it: a
//! span is dropped here only where the Python filter would drop it and take the same fields.
//!
//! When every span a line keeps is a plain one of the kinds the readers read, they are made Python
//! `SpanData` here instead (`build.rs`), and Python parses nothing of the line.
//!
//! `gymtrace check` reads every span: given `check` (the attribute keys its rules read), a
//! `Reducer` drops nothing and makes each span of a line as the checker holds it, those keys only
//! unless a summary reader reads the span, or gives the line back as it came.
//!
//! Every attribute name and kind comes from the caller (gymtrace's constants module).

// Maps keyed by short attribute names and IDs, looked up several times a span: FxHash, not the
// standard SipHash (whose resistance to chosen collisions a reader of local trace files does
// not need), reads the 10,000-rollout run in 0.88x the time (`farm-bench -n 8`).
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

mod build;
use build::{BuildWith, Builder, Kept, Lean, Object};
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// A walk along one line of JSON: the request's levels are read here, member by member (each object
/// must be one, each key given once), and each value by serde_json from where the walk is, so each
/// span is read once, its text and its fields together.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&mut self) -> Option<u8> {
        let bytes = self.text.as_bytes();
        while self.at < bytes.len() && matches!(bytes[self.at], b' ' | b'\t' | b'\n' | b'\r') {
            self.at += 1;
        }
        bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// One JSON value of type `T` from here; None when there is none (nothing moves then).
    fn value<T: Deserialize<'a>>(&mut self) -> Option<T> {
        self.peek()?;
        let mut stream = serde_json::Deserializer::from_str(&self.text[self.at..]).into_iter::<T>();
        let found = stream.next()?.ok()?;
        self.at += stream.byte_offset();
        Some(found)
    }

    /// The text of the JSON value from here.
    fn raw(&mut self) -> Option<&'a str> {
        self.peek()?;
        let start = self.at;
        self.value::<IgnoredAny>()?;
        Some(&self.text[start..self.at])
    }

    /// The members of an object from here, each key once: `each(cursor, key)` reads its value.
    fn members(&mut self, mut each: impl FnMut(&mut Self, &str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        let mut keys: Vec<Cow<'a, str>> = Vec::new();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            let key = self.value::<Str<'a>>()?.0;
            if keys.contains(&key) {
                return None; // a key twice: Python's parsers keep the last
            }
            self.eat(b':')?;
            each(self, &key)?;
            keys.push(key);
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The elements of an array from here (or none for null, as the Python reader reads it).
    fn elements(&mut self, mut each: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if self.peek()? == b'n' {
            return self.value::<()>();
        }
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            each(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// JSON text as serde_json reads it from a line in memory: borrowed from the line when it holds no
/// escape, made only when it does. (Serde reads a `Cow<str>` outside a derived struct's borrowed
/// field as a new `String` every time: two dozen allocations a span.)
struct Str<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for StrVisitor<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, text: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(text)))
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(text.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(StrVisitor(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct Span<'a> {
    #[serde(rename = "traceId", borrow, default)]
    trace_id: Option<&'a RawValue>,
    #[serde(rename = "spanId", borrow, default)]
    span_id: Option<&'a RawValue>,
    #[serde(rename = "startTimeUnixNano", borrow, default)]
    start: Option<&'a RawValue>,
    #[serde(rename = "endTimeUnixNano", borrow, default)]
    end: Option<&'a RawValue>,
    #[serde(borrow, default)]
    attributes: Option<AttributeList<'a>>,
}

/// A span's attributes, room made at once for as many as gymtrace writes on most spans (grown one
/// by one from none, the list was reallocated four times a span).
struct AttributeList<'a>(Vec<Attribute<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for AttributeList<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for ListVisitor<'a> {
            type Value = AttributeList<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of attributes")
            }
            fn visit_seq<S: SeqAccess<'de>>(
                self,
                mut seq: S,
            ) -> Result<AttributeList<'a>, S::Error> {
                let mut found = Vec::with_capacity(16);
                while let Some(item) = seq.next_element::<Attribute<'a>>()? {
                    found.push(item);
                }
                Ok(AttributeList(found))
            }
        }
        deserializer.deserialize_seq(ListVisitor(std::marker::PhantomData))
    }
}

/// One `{key, value}` of a span's attributes: an object (a derived struct would read an array too),
/// whose key is text and not given twice. Its value is read as it is walked, once: the members of
/// an `AnyValue` object, or none for null or anything else (which no plain path reads).
struct Attribute<'a> {
    key: Cow<'a, str>,
    value: Option<Members<'a>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Attribute<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AttributeVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for AttributeVisitor<'a> {
            type Value = Attribute<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an attribute object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Attribute<'a>, M::Error> {
                let (mut key, mut value, mut keys, mut values) = (None, None, 0, 0);
                while let Some(Str(name)) = map.next_key::<Str<'a>>()? {
                    match name.as_ref() {
                        "key" => {
                            keys += 1;
                            key = Some(map.next_value::<Str<'a>>()?.0);
                        }
                        "value" => {
                            values += 1;
                            value = map.next_value::<AnyValue<'a>>()?.0;
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                if keys != 1 || values > 1 {
                    return Err(serde::de::Error::custom(
                        "not an attribute as gymtrace writes it",
                    ));
                }
                Ok(Attribute {
                    key: key.unwrap(),
                    value,
                })
            }
        }
        deserializer.deserialize_map(AttributeVisitor(std::marker::PhantomData))
    }
}

/// An `AnyValue` object's members, in order, duplicates included (JSON allows them; Python's
/// parsers keep the last, so a value with one is left to the Python reader). Nearly every value has
/// one member, kept here without a heap allocation (one per attribute was most of the reader's
/// calls to `malloc`).
struct Members<'a> {
    first: Option<(Cow<'a, str>, &'a RawValue)>,
    rest: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> Members<'a> {
    /// The one member, when there is exactly one.
    fn single(&self) -> Option<(&str, &'a RawValue)> {
        match (&self.first, self.rest.is_empty()) {
            (Some((key, raw)), true) => Some((key.as_ref(), *raw)),
            _ => None,
        }
    }

    fn iter(&self) -> impl Iterator<Item = &(Cow<'a, str>, &'a RawValue)> {
        self.first.iter().chain(self.rest.iter())
    }
}

/// An attribute's value as the walk reads it: the members of an object; None for null (no value,
/// as the Python filter reads it) or any other JSON, which every plain path leaves to Python.
struct AnyValue<'a>(Option<Members<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for AnyValue<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AnyVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for AnyVisitor<'a> {
            type Value = AnyValue<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<AnyValue<'a>, M::Error> {
                let mut found = Members {
                    first: None,
                    rest: Vec::new(),
                };
                while let Some((Str(name), raw)) = map.next_entry::<Str<'a>, &'a RawValue>()? {
                    if found.first.is_none() {
                        found.first = Some((name, raw));
                    } else {
                        found.rest.push((name, raw));
                    }
                }
                Ok(AnyValue(Some(found)))
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<AnyValue<'a>, S::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(AnyValue(None))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<AnyValue<'a>, E> {
                Ok(AnyValue(None))
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<AnyValue<'a>, E> {
                Ok(AnyValue(None))
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<AnyValue<'a>, E> {
                Ok(AnyValue(None))
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<AnyValue<'a>, E> {
                Ok(AnyValue(None))
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<AnyValue<'a>, E> {
                Ok(AnyValue(None))
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<AnyValue<'a>, E> {
                Ok(AnyValue(None))
            }
        }
        deserializer.deserialize_any(AnyVisitor(std::marker::PhantomData))
    }
}

/// The members of an `AnyValue` found inside another value (an array's elements), read as an
/// attribute's value is.
fn any_value(raw: &RawValue) -> Option<Members<'_>> {
    serde_json::from_str::<AnyValue>(raw.get()).ok()?.0
}

fn text(raw: &RawValue) -> Option<Cow<'_, str>> {
    // A raw value is valid JSON (serde checked it as it was read, control characters too): a string
    // without a backslash is its text between the quotes, taken without a parser.
    let json = raw.get();
    if json.len() >= 2 && json.starts_with('"') {
        let inside = &json[1..json.len() - 1];
        if !inside.contains('\\') {
            return Some(Cow::Borrowed(inside));
        }
    }
    serde_json::from_str::<Str>(json).ok().map(|found| found.0)
}

/// 1 to 19 ASCII digits (as gymtrace writes an int64 or a time) as a `T` they fit in; None for
/// anything else, a number too large for `T` too (the Python reader reads those).
fn ascii_digits<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A string of ASCII digits as gymtrace writes an int64: small enough for a signed 64-bit integer
/// (the time split's arrays), else None.
fn digits(raw: &RawValue) -> Option<i64> {
    ascii_digits(&text(raw)?)
}

/// What `stringValue` holds when it is text, whatever else the value holds (the Python filter reads
/// a kind and a rollout ID so).
fn string_member<'a>(value: Option<&Members<'a>>) -> Option<Cow<'a, str>> {
    let found = value?;
    if found.iter().filter(|(k, _)| k == "stringValue").count() != 1 {
        return None;
    }
    let (_, raw) = found.iter().find(|(k, _)| k == "stringValue")?;
    text(raw)
}

struct Attributes<'s, 'a>(&'s [Attribute<'a>]);

impl<'s, 'a> Attributes<'s, 'a> {
    /// The value of ``key``: None when the span has no such attribute, Some(None) when it has one
    /// without a value.
    fn get(&self, key: &str) -> Option<Option<&'s Members<'a>>> {
        self.0
            .iter()
            .find(|item| item.key == key)
            .map(|item| item.value.as_ref())
    }

    fn contains_key(&self, key: &str) -> bool {
        self.0.iter().any(|item| item.key == key)
    }
}

enum Plain<'a> {
    Text(Cow<'a, str>),
    Int(i64),
}

/// A value of one member, ASCII text or an int64 as a string of digits: the plain values this
/// filter drops a span for (any other is left to the Python filter).
fn plain<'a>(value: Option<&Members<'a>>) -> Option<Plain<'a>> {
    let (kind, raw) = value?.single()?;
    match kind {
        "stringValue" => text(raw).filter(|t| t.is_ascii()).map(Plain::Text),
        "intValue" => digits(raw).map(Plain::Int),
        _ => None,
    }
}

fn plain_int(value: Option<&Members<'_>>) -> Option<i64> {
    match plain(value)? {
        Plain::Int(number) => Some(number),
        Plain::Text(_) => None,
    }
}

fn ascii_lower(raw: Option<&RawValue>) -> Option<String> {
    let found = text(raw?)?;
    found.is_ascii().then(|| found.to_ascii_lowercase())
}

#[derive(Clone)]
enum Owned {
    Text(String),
    Int(i64),
}

impl Owned {
    fn of(value: Plain<'_>) -> Owned {
        match value {
            Plain::Text(t) => Owned::Text(t.into_owned()),
            Plain::Int(n) => Owned::Int(n),
        }
    }

    fn to_py(&self, py: Python<'_>) -> Py<PyAny> {
        match self {
            Owned::Text(t) => PyString::intern(py, t).into_any().unbind(),
            Owned::Int(n) => n.into_pyobject(py).unwrap().into_any().unbind(),
        }
    }
}

/// The attribute names and kinds the filter reads, given by the caller.
struct Names {
    rollout: String,
    nemo_rollout: String,
    kind: String,
    ray_attempt: String,
    output_tokens: String,
    run: String,
    version: String,
    operation: String,
    attempt: String,
    read_kinds: HashSet<String>,
    part_by_kind: HashMap<String, i64>,
    part_by_operation: HashMap<String, i64>,
}

struct Dropped {
    trace_id: String,
    rollout_id: String,
    end: i64,
    interval: Option<(i64, i64, i64, i64)>, // attempt, part, start, end
    tokens: Option<(String, i64, Option<Owned>, Option<Owned>)>, // span ID, count, run, version
}

/// What becomes of a span here.
enum Verdict {
    /// Dropped: what the Python filter takes of it.
    Drop(Dropped),
    /// Of a kind the Python filter keeps whatever else it holds.
    Read,
    /// Left to the Python filter.
    Unsure,
}

fn verdict(names: &Names, span: &Span<'_>) -> Verdict {
    let Some(attributes) = span.attributes.as_ref().map(|list| list.0.as_slice()) else {
        return Verdict::Unsure;
    };
    // A span has a dozen attributes or so: a look along them beats hashing each key.
    let at = Attributes(attributes);
    let kind = at.get(names.kind.as_str()).map(string_member);
    match kind {
        Some(Some(kind)) if names.read_kinds.contains(kind.as_ref()) => Verdict::Read,
        // A kind that is not text: the Python filter keeps the span, or its decoder names it.
        Some(None) => Verdict::Unsure,
        _ => match dropped(names, span, &at, kind.flatten()) {
            Some(found) => Verdict::Drop(found),
            None => Verdict::Unsure,
        },
    }
}

/// What the Python filter takes of a span it drops, given its attributes and its kind (none the
/// readers read), or None when it would keep the span or this filter is not sure (the span stays
/// in the line, for the Python filter).
fn dropped(
    names: &Names,
    span: &Span<'_>,
    at: &Attributes<'_, '_>,
    kind: Option<Cow<'_, str>>,
) -> Option<Dropped> {
    for (i, item) in at.0.iter().enumerate() {
        if at.0[..i].iter().any(|other| other.key == item.key) {
            return None; // a key twice: the Python reader reads the last
        }
    }
    // A NeMo Gym rollout ID (an attempt suffix to read), a Ray re-run: the Python filter's.
    if at.contains_key(names.nemo_rollout.as_str()) || at.contains_key(names.ray_attempt.as_str()) {
        return None;
    }
    let rollout_id = string_member(at.get(names.rollout.as_str())?)?.into_owned();
    let end = digits(span.end?)?;
    let trace_id = ascii_lower(span.trace_id)?;
    let mut tokens = None;
    if let Some(value) = at.get(names.output_tokens.as_str()) {
        let count = plain_int(value)?;
        if count != 0 {
            let span_id = ascii_lower(span.span_id)?;
            let run = match at.get(names.run.as_str()) {
                Some(value) => Some(Owned::of(plain(value)?)),
                None => None,
            };
            let version = match at.get(names.version.as_str()) {
                Some(value) => Some(Owned::of(plain(value)?)),
                None => None,
            };
            tokens = Some((span_id, count, run, version));
        }
    }
    let part = match &kind {
        Some(kind) => names.part_by_kind.get(kind.as_ref()).copied(),
        None => match at.get(names.operation.as_str()) {
            Some(value) => match plain(value)? {
                Plain::Text(operation) => names.part_by_operation.get(operation.as_ref()).copied(),
                Plain::Int(_) => None,
            },
            None => None,
        },
    };
    let mut interval = None;
    if let Some(part) = part {
        let start = digits(span.start?)?;
        if let Some(value) = at.get(names.attempt.as_str()) {
            interval = Some((plain_int(value)?, part, start, end));
        }
    }
    Some(Dropped {
        trace_id,
        rollout_id,
        end,
        interval,
        tokens,
    })
}

/// A dropped span's output tokens: its trace ID, span ID, count, run ID and policy version.
type Tokens = (String, String, i64, Option<Owned>, Option<Owned>);

/// Reduces the lines of a trace file to the spans the Python reader reads, and keeps what it takes
/// of the others until asked (:meth:`times`, :meth:`ends`, :meth:`tokens`).
#[pyclass(module = "gymtrace_native")]
struct Reducer {
    names: Names,
    builder: Option<Builder>,
    // `gymtrace check`'s reading: no span dropped, each made as the checker holds it.
    lean: Option<Lean>,
    // What was taken of the last line, counted when the next line is reduced or the takings are
    // asked for: a line the Python reader then skips (a last line cut short) is taken back.
    staged: Vec<Dropped>,
    times: HashMap<(String, String, i64), Vec<i64>>,
    ends: HashMap<(String, String), i64>,
    tokens: Vec<Tokens>,
}

/// A line reduced: the spans Python reads, as a line to parse, or made here.
enum Reduced<'py> {
    Line(String),
    Spans(Bound<'py, PyList>),
}

impl<'py> Reduced<'py> {
    fn into_py(self, py: Python<'py>) -> Bound<'py, PyAny> {
        match self {
            Reduced::Line(out) => PyBytes::new(py, out.as_bytes()).into_any(),
            Reduced::Spans(spans) => spans.into_any(),
        }
    }
}

/// Every span kept of a line, made here, in the line's order; None when one of them (or its
/// resource) is not what `decode_reduced`'s plain path reads.
fn made<'py>(
    py: Python<'py>,
    builder: &Builder,
    lean: Option<&Lean>,
    whole: &[(Option<&str>, Vec<Kept<'_>>)],
) -> Option<Bound<'py, PyList>> {
    let spans = PyList::empty(py);
    for (resource, kept) in whole {
        let (service, instance) = builder.service(py, *resource)?;
        for span in kept {
            spans
                .append(builder.span(py, span, &service, &instance, lean)?)
                .ok()?;
        }
    }
    Some(spans)
}

impl Reducer {
    /// :meth:`reduced` of a line as read (bytes), as the Python object handed back; None when it
    /// is not UTF-8 or not a request as gymtrace writes it.
    fn reduced_bytes<'py>(&mut self, py: Python<'py>, line: &[u8]) -> Option<Bound<'py, PyAny>> {
        let text = std::str::from_utf8(line).ok()?;
        Some(self.reduced(py, text)?.into_py(py))
    }

    /// The line with only the spans this filter does not drop, or None when it is not a request as
    /// gymtrace writes it (then the Python reader reads it as it is, or names what is wrong).
    fn reduced<'py>(&mut self, py: Python<'py>, line: &str) -> Option<Reduced<'py>> {
        self.commit();
        // What Python's bytes.strip() strips: the line is handed over as read, newline and all.
        let line = line.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c'));
        let names = &self.names;
        let checking = self.lean.is_some();
        let mut taken = Vec::new();
        // The spans kept, by resource, while every one is of a kind the readers read (then they
        // may be made here, with no line for Python to parse).
        let mut whole: Option<Vec<(Option<&str>, Vec<Kept>)>> =
            self.builder.as_ref().map(|_| Vec::new());
        // The line reduced. Check never reads it (it keeps every span: made here, or the line as it
        // came), so no span's text is copied into it then.
        let mut out = String::with_capacity(if checking { 0 } else { line.len() / 4 });
        out.push_str("{\"resourceSpans\":[");
        let mut cursor = Cursor { text: line, at: 0 };
        let mut resources = 0;
        cursor.members(|cursor, key| {
            if key != "resourceSpans" {
                return cursor.value::<IgnoredAny>().map(drop);
            }
            cursor.elements(|cursor| {
                // {"resource": ..., "scopeSpans": [{"spans": [...]}, ...]}, in either order.
                let (mut resource, mut scopes) = (None, String::new());
                let mut kept: Vec<Kept> = Vec::new();
                cursor.members(|cursor, key| match key {
                    "resource" => {
                        resource = Some(cursor.raw()?);
                        Some(())
                    }
                    "scopeSpans" => cursor.elements(|cursor| {
                        if !scopes.is_empty() {
                            scopes.push(',');
                        }
                        scopes.push_str("{\"spans\":[");
                        let mut first = true;
                        cursor.members(|cursor, key| {
                            if key != "spans" {
                                return cursor.value::<IgnoredAny>().map(drop);
                            }
                            cursor.elements(|cursor| {
                                if cursor.peek()? != b'{' {
                                    return None; // the Python reader names it
                                }
                                if checking {
                                    // Every span kept, its members read here once, as it is walked.
                                    kept.push(Kept::Read(cursor.value::<Object>()?));
                                    return Some(());
                                }
                                let start = cursor.at;
                                let found = match cursor.value::<Span>() {
                                    Some(span) => verdict(names, &span),
                                    None => {
                                        cursor.value::<IgnoredAny>()?; // an odd span: kept
                                        Verdict::Unsure
                                    }
                                };
                                let raw = &cursor.text[start..cursor.at];
                                match found {
                                    Verdict::Drop(found) => taken.push(found),
                                    Verdict::Read | Verdict::Unsure => {
                                        if !first {
                                            scopes.push(',');
                                        }
                                        first = false;
                                        scopes.push_str(raw);
                                        if matches!(found, Verdict::Read) {
                                            kept.push(Kept::Text(raw));
                                        } else {
                                            whole = None;
                                        }
                                    }
                                }
                                Some(())
                            })
                        })?;
                        scopes.push_str("]}");
                        Some(())
                    }),
                    _ => cursor.value::<IgnoredAny>().map(drop),
                })?;
                if let Some(whole) = whole.as_mut() {
                    whole.push((resource, kept));
                }
                if resources > 0 {
                    out.push(',');
                }
                resources += 1;
                out.push('{');
                if let Some(resource) = resource.filter(|raw| *raw != "null") {
                    out.push_str("\"resource\":");
                    out.push_str(resource);
                    out.push(',');
                }
                out.push_str("\"scopeSpans\":[");
                out.push_str(&scopes);
                out.push_str("]}");
                Some(())
            })
        })?;
        if cursor.peek().is_some() {
            return None; // more after the request
        }
        out.push_str("]}");
        let made = match (whole, self.builder.as_ref()) {
            (Some(whole), Some(builder)) => made(py, builder, self.lean.as_ref(), &whole),
            _ => None,
        };
        // Staged only once the whole line has read: a line that does not is the Python reader's.
        self.staged = taken;
        match made {
            Some(spans) => Some(Reduced::Spans(spans)),
            None if checking => None, // nothing dropped: Python reads the line as it came
            None => Some(Reduced::Line(out)),
        }
    }

    fn commit(&mut self) {
        for found in std::mem::take(&mut self.staged) {
            if let Some((attempt, part, start, end)) = found.interval {
                self.times
                    .entry((found.trace_id.clone(), found.rollout_id.clone(), attempt))
                    .or_default()
                    .extend_from_slice(&[part, start, end]);
            }
            if let Some((span_id, count, run, version)) = found.tokens {
                self.tokens
                    .push((found.trace_id.clone(), span_id, count, run, version));
            }
            let earliest = self
                .ends
                .entry((found.trace_id, found.rollout_id))
                .or_insert(found.end);
            if found.end < *earliest {
                *earliest = found.end;
            }
        }
    }
}

/// A file the caller opened, read here without being closed here.
struct Borrowed(ManuallyDrop<File>);

impl Read for Borrowed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

/// The lines of a plain trace file (or of a byte range of it), each reduced as it is read:
/// ``(line, unfinished)``, the line reduced, or as it was read when it is not a request as gymtrace
/// writes it; ``unfinished`` when it has no newline. A line is read here into a buffer kept from
/// line to line, not made a Python object of ~0.5 MB first.
#[pyclass(module = "gymtrace_native")]
struct Lines {
    reader: BufReader<Borrowed>,
    at: u64,
    stop: Option<u64>,
    line: Vec<u8>,
    reducer: Py<Reducer>,
}

#[pymethods]
impl Lines {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<(Bound<'py, PyAny>, bool)>> {
        if self.stop.is_some_and(|stop| self.at >= stop) {
            return Ok(None);
        }
        self.line.clear();
        let read = self.reader.read_until(b'\n', &mut self.line)?;
        if read == 0 {
            return Ok(None);
        }
        self.at += read as u64;
        let unfinished = !self.line.ends_with(b"\n");
        let found = self.reducer.borrow_mut(py).reduced_bytes(py, &self.line);
        let found = found.unwrap_or_else(|| PyBytes::new(py, &self.line).into_any());
        Ok(Some((found, unfinished)))
    }
}

#[pymethods]
impl Reducer {
    /// The lines of the plain file open as ``fd`` (not closed here), from byte ``start`` to the
    /// line that ``stop`` falls in (None: to its end), reduced as they are read (:class:`Lines`).
    #[pyo3(signature = (fd, start, stop=None))]
    fn read(slf: Bound<'_, Self>, fd: i32, start: u64, stop: Option<u64>) -> PyResult<Lines> {
        // SAFETY: the caller keeps the file open while the lines are read; ManuallyDrop leaves it open.
        let mut file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
        file.seek(SeekFrom::Start(start))?;
        Ok(Lines {
            reader: BufReader::with_capacity(1 << 20, Borrowed(file)),
            at: start,
            stop,
            line: Vec::new(),
            reducer: slf.unbind(),
        })
    }

    /// ``keys``: the rollout ID, NeMo Gym's rollout ID, the kind, Ray's task attempt, the output
    /// tokens, the run ID, the policy version, the GenAI operation and the episode attempt;
    /// ``read_kinds``: the kinds the Python reader reads whole; the time split's part of a kind and
    /// of a GenAI operation. ``check``: the attribute keys ``gymtrace check`` reads of a span no
    /// summary reader reads; then no span is dropped and every span of a line is made here as the
    /// checker holds it (``build`` is needed), or the line is handed back as it came.
    #[new]
    #[pyo3(signature = (keys, read_kinds, part_by_kind, part_by_operation, build=None, check=None))]
    fn new(
        py: Python<'_>,
        keys: (
            String,
            String,
            String,
            String,
            String,
            String,
            String,
            String,
            String,
        ),
        read_kinds: HashSet<String>,
        part_by_kind: HashMap<String, i64>,
        part_by_operation: HashMap<String, i64>,
        build: Option<BuildWith>,
        check: Option<HashSet<String>>,
    ) -> PyResult<Self> {
        let (
            rollout,
            nemo_rollout,
            kind,
            ray_attempt,
            output_tokens,
            run,
            version,
            operation,
            attempt,
        ) = keys;
        let builder = build.map(|build| Builder::new(py, build, &nemo_rollout));
        if check.is_some() && builder.is_none() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "check= needs build=: the checker's spans are made here",
            ));
        }
        let lean = check.map(|keys| Lean {
            keys: keys
                .into_iter()
                .map(|key| {
                    let text = PyString::intern(py, &key).unbind();
                    (key, text)
                })
                .collect(),
            read_kinds: read_kinds.clone(),
            kind: PyString::intern(py, &kind).unbind(),
            rollout: PyString::intern(py, &rollout).unbind(),
            ray_attempt: PyString::intern(py, &ray_attempt).unbind(),
        });
        Ok(Reducer {
            builder,
            lean,
            names: Names {
                rollout,
                nemo_rollout,
                kind,
                ray_attempt,
                output_tokens,
                run,
                version,
                operation,
                attempt,
                read_kinds,
                part_by_kind,
                part_by_operation,
            },
            staged: Vec::new(),
            times: HashMap::default(),
            ends: HashMap::default(),
            tokens: Vec::new(),
        })
    }

    /// One line (bytes) with only the spans the Python reader must read; the line itself when it
    /// is not a request as gymtrace writes it.
    fn reduce<'py>(&mut self, py: Python<'py>, line: Bound<'py, PyBytes>) -> Bound<'py, PyAny> {
        let found = self.reduced_bytes(py, line.as_bytes());
        found.unwrap_or_else(|| line.into_any())
    }

    /// Takes back what was taken of the line reduced last (the Python reader skipped it).
    fn discard(&mut self) {
        self.staged.clear();
    }

    /// The time split's intervals taken since last asked, ``{(trace ID, rollout ID, attempt):
    /// bytes}``: the machine's 64-bit integers, ``part, start, end`` after one another
    /// (``array("Q")``: none is negative). IDs are interned: the same text in the other takings
    /// and the spans is one object.
    fn times<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.commit();
        let found = PyDict::new(py);
        // Taken, not drained: what was held is freed as it goes over (a half of a large run).
        for ((trace_id, rollout_id, attempt), flat) in std::mem::take(&mut self.times) {
            let bytes: Vec<u8> = flat.iter().flat_map(|n| n.to_ne_bytes()).collect();
            let key = (
                PyString::intern(py, &trace_id),
                PyString::intern(py, &rollout_id),
                attempt,
            );
            found.set_item(key, PyBytes::new(py, &bytes))?;
        }
        Ok(found)
    }

    /// The earliest end of a dropped span per ``(trace ID, rollout ID)``, since last asked.
    fn ends<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.commit();
        let found = PyDict::new(py);
        for ((trace_id, rollout_id), end) in std::mem::take(&mut self.ends) {
            found.set_item(
                (
                    PyString::intern(py, &trace_id),
                    PyString::intern(py, &rollout_id),
                ),
                end,
            )?;
        }
        Ok(found)
    }

    /// ``(trace ID, span ID, output tokens, run ID, policy version)`` of every dropped span that
    /// counted tokens, in the order read (a span read twice is in twice), since last asked.
    fn tokens<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.commit();
        let found = PyList::empty(py);
        for (trace_id, span_id, count, run, version) in std::mem::take(&mut self.tokens) {
            let run = run.map(|v| v.to_py(py));
            let version = version.map(|v| v.to_py(py));
            found.append((
                PyString::intern(py, &trace_id),
                span_id,
                count,
                run,
                version,
            ))?;
        }
        Ok(found)
    }
}

#[pymodule]
fn gymtrace_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Reducer>()?;
    module.add_class::<Lines>()?;
    Ok(())
}
