//! The spans a summary reader keeps whole (of the kinds it reads: rollout roots, episodes, runs,
//! train steps, consumed records, live markers), made here into the same `SpanData` that
//! `gymtrace._model.spandata.decode_reduced` makes of them: what its plain path (`_plain_span`,
//! without events) reads, read the same way. A span that path would not read (a value that is not
//! plain, an ID in capitals, a NeMo Gym rollout ID, a link whose attribute is not plain) is None
//! here, and its line goes to Python as before. An array of ASCII text and integers (a consumed
//! record's) is made as the checked decoder makes it, a tuple.
//!
//! For `gymtrace check` every span of a line is made, as `decode_for_check` makes it (`Lean`).

// Maps keyed by short attribute names and IDs, looked up several times a span: FxHash, not the
// standard SipHash (whose resistance to chosen collisions a reader of local trace files does
// not need), reads the 10,000-rollout run in 0.88x the time (`farm-bench -n 8`).
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::{any_value, ascii_digits, text, Attribute, AttributeList, Members};

// Which Python classes `_GYM_TYPES` allows a gym attribute's value to be, as bits.
pub const TEXT: u8 = 1;
pub const INT: u8 = 2;
pub const FLOAT: u8 = 4;
pub const BOOL: u8 = 8;

/// A field as it is given, `null` too: the Python reader tells a field that is null from one that
/// is missing (serde's `Option` does not).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The members read of a span, and of a link or a resource, which hold some of the same (a link's
/// IDs and attributes, a resource's attributes): one struct for the three, the others' members
/// absent.
#[derive(Deserialize)]
pub struct Object<'a> {
    #[serde(rename = "traceId", borrow, default, deserialize_with = "present")]
    trace_id: Option<&'a RawValue>,
    #[serde(rename = "spanId", borrow, default, deserialize_with = "present")]
    span_id: Option<&'a RawValue>,
    #[serde(rename = "parentSpanId", borrow, default, deserialize_with = "present")]
    parent: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    name: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    kind: Option<&'a RawValue>,
    #[serde(
        rename = "startTimeUnixNano",
        borrow,
        default,
        deserialize_with = "present"
    )]
    start: Option<&'a RawValue>,
    #[serde(
        rename = "endTimeUnixNano",
        borrow,
        default,
        deserialize_with = "present"
    )]
    end: Option<&'a RawValue>,
    // Read as the walk goes, not kept as text to be read again: a span's longest member.
    #[serde(borrow, default, deserialize_with = "attribute_list")]
    attributes: Vec<Attribute<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    links: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    events: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    status: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Status<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    code: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    message: Option<&'a RawValue>,
}

/// A span kept of a line: its text, or its members as the walk along the line read them
/// (`gymtrace check`, which keeps every span: each is read once, by the walk).
pub enum Kept<'a> {
    Text(&'a str),
    Read(Object<'a>),
}

/// What a `Builder` is made of, from `gymtrace._model.spandata.native_span_builder`: the function
/// that makes a `SpanData` of its fields, `LinkData`, the types each gym attribute may hold (bits),
/// the span kinds' and the statuses' names by number.
pub type BuildWith = (
    Py<PyAny>,
    Py<PyAny>,
    HashMap<String, u8>,
    Vec<String>,
    Vec<String>,
);

/// How a span is made: given by the caller (`_model/spandata.py`).
pub struct Builder {
    make_span: Py<PyAny>,
    make_link: Py<PyAny>,
    gym_types: HashMap<String, u8>,
    kinds: Vec<Py<PyString>>,
    statuses: Vec<Py<PyString>>,
    fields: Vec<Py<PyString>>,
    // A span's fields as a dict of every field's key (values None), copied for each span: the copy
    // is made at its final size, where 14 insertions into a new dict resize it twice.
    template: Py<PyDict>,
    // The span names made so far (a run has a few dozen), each text made once.
    span_names: std::sync::Mutex<HashMap<String, Py<PyString>>>,
    no_events: Py<PyTuple>,
    nemo_rollout: String,
    // The trace ID made last: a line's spans are mostly of one trace, which then share one text
    // (less memory; its hash, which the checker's maps take of every span, worked out once).
    last_trace: std::sync::Mutex<Option<(String, Py<PyString>)>>,
}

// The SpanData fields, in the order `_plain_span` gives them.
const FIELDS: [&str; 14] = [
    "trace_id",
    "span_id",
    "parent_id",
    "name",
    "start_ns",
    "end_ns",
    "attributes",
    "events",
    "links",
    "status",
    "status_message",
    "service",
    "span_kind",
    "service_instance",
];

/// What of a span is made: every field but its events (which no summary reader reads); every field
/// with its events, which must then be none (a span with events is left to Python); or only the
/// attributes of some keys, and no links.
enum Read<'k> {
    Whole,
    WholeWithEvents,
    Keys(&'k HashMap<String, Py<PyString>>),
}

/// What `gymtrace check` reads of a span no summary reader reads (see `Builder::span`).
pub struct Lean {
    // The attribute keys it reads, each with its Python text (interned once, not per span).
    pub keys: HashMap<String, Py<PyString>>,
    pub read_kinds: HashSet<String>,
    pub kind: Py<PyString>,
    pub rollout: Py<PyString>,
    pub ray_attempt: Py<PyString>,
}

fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

fn is_null(raw: &RawValue) -> bool {
    raw.get() == "null"
}

/// A JSON integer (not a float, a bool or a string), as Python's parsers read one.
fn integer(raw: &RawValue) -> Option<i64> {
    let text = raw.get();
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 18 {
        return None;
    }
    text.parse().ok()
}

/// An `intValue`: a string of ASCII digits (as gymtrace writes an int64) or a JSON integer.
fn int_value(raw: &RawValue) -> Option<i64> {
    match text(raw) {
        Some(t) => ascii_digits(&t),
        None => integer(raw),
    }
}

/// A `doubleValue`: a JSON number, as Python's `float()` reads it.
fn double_value(raw: &RawValue) -> Option<f64> {
    let text = raw.get();
    if !text
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
    {
        return None;
    }
    text.parse::<f64>().ok().filter(|n| n.is_finite())
}

/// The Python value of a plain `AnyValue` member, and its class's bit: ASCII text (interned if
/// asked), a boolean, an integer, a double; None for any other member or value.
fn value_of<'py>(
    py: Python<'py>,
    member: &str,
    raw: &RawValue,
    intern: bool,
) -> Option<(Bound<'py, PyAny>, u8)> {
    Some(match member {
        "stringValue" => {
            let t = text(raw).filter(|t| t.is_ascii())?;
            let made = if intern {
                PyString::intern(py, &t)
            } else {
                PyString::new(py, &t)
            };
            (made.into_any(), TEXT)
        }
        "boolValue" => {
            let flag: bool = serde_json::from_str(raw.get()).ok()?;
            (
                pyo3::types::PyBool::new(py, flag).to_owned().into_any(),
                BOOL,
            )
        }
        "intValue" => (int_value(raw)?.into_pyobject(py).ok()?.into_any(), INT),
        "doubleValue" => (double_value(raw)?.into_pyobject(py).ok()?.into_any(), FLOAT),
        _ => return None,
    })
}

/// An `arrayValue` of ASCII text and integers (a consumed record's rollout IDs and outcomes) as
/// the checked decoder reads it, a tuple; None for any other array, which Python reads.
fn array<'py>(py: Python<'py>, raw: &RawValue) -> Option<Bound<'py, PyAny>> {
    let members: HashMap<String, &RawValue> = serde_json::from_str(raw.get()).ok()?;
    let values = members.get("values").filter(|_| members.len() == 1)?;
    let values: Vec<&RawValue> = serde_json::from_str(values.get()).ok()?;
    let mut items = Vec::with_capacity(values.len());
    for value in values {
        let found = any_value(value)?;
        let (member, raw) = found.single()?;
        items.push(match member {
            "stringValue" => PyString::new(py, &text(raw).filter(|t| t.is_ascii())?).into_any(),
            "intValue" => int_value(raw)?.into_pyobject(py).ok()?.into_any(),
            _ => return None,
        });
    }
    PyTuple::new(py, items).ok().map(Bound::into_any)
}

/// A list of `{key, value}` attributes; none for a member null (`_array(None)`, as for a member
/// missing), an error for anything but an array of such objects (then the span, or the line, is
/// Python's to read).
fn attribute_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Attribute<'de>>, D::Error> {
    Ok(Option::<AttributeList<'de>>::deserialize(d)?
        .map(|list| list.0)
        .unwrap_or_default())
}

fn lower_hex(text: &str, width: usize) -> bool {
    text.len() == width && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A string of 1 to 19 ASCII digits, as `_plain_span` reads a time.
fn time(raw: Option<&RawValue>) -> Option<u64> {
    ascii_digits(&text(raw?)?)
}

impl Builder {
    pub fn new(py: Python<'_>, build: BuildWith, nemo_rollout: &str) -> Builder {
        let (make_span, make_link, gym_types, kinds, statuses) = build;
        let intern = |names: &[String]| {
            names
                .iter()
                .map(|n| PyString::intern(py, n).unbind())
                .collect()
        };
        let fields: Vec<Py<PyString>> = FIELDS
            .iter()
            .map(|n| PyString::intern(py, n).unbind())
            .collect();
        let template = PyDict::new(py);
        for field in &fields {
            template
                .set_item(field.bind(py), py.None())
                .expect("a dict of text keys");
        }
        Builder {
            make_span,
            make_link,
            gym_types,
            kinds: intern(&kinds),
            statuses: intern(&statuses),
            fields,
            template: template.unbind(),
            span_names: std::sync::Mutex::new(HashMap::default()),
            no_events: PyTuple::empty(py).unbind(),
            nemo_rollout: nemo_rollout.to_owned(),
            last_trace: std::sync::Mutex::new(None),
        }
    }

    /// `service.name` and `service.instance.id` of a resource whose attributes the Python reader
    /// reads on its fast path, both given as text (or absent); None otherwise.
    pub fn service<'py>(
        &self,
        py: Python<'py>,
        resource: Option<&str>,
    ) -> Option<(Bound<'py, PyString>, Bound<'py, PyString>)> {
        let (mut service, mut instance) = (String::new(), String::new());
        // `resource_spans.get("resource") or {}`: a falsy value is no resource.
        let raw = resource.filter(|r| !matches!(*r, "null" | "{}" | "[]" | "\"\"" | "0" | "false"));
        if let Some(raw) = raw {
            if !raw.starts_with('{') {
                return None;
            }
            let found: Object = serde_json::from_str(raw).ok()?;
            for item in &found.attributes {
                let plain = self.fast_plain(py, &item.key, item.value.as_ref()?)?;
                if item.key == "service.name" || item.key == "service.instance.id" {
                    let text = plain.cast::<PyString>().ok()?.to_str().ok()?.to_owned();
                    if item.key == "service.name" {
                        service = text;
                    } else {
                        instance = text;
                    }
                }
            }
        }
        Some((
            PyString::intern(py, &service),
            PyString::intern(py, &instance),
        ))
    }

    /// A value as `_from_key_values`' fast path reads it (`_plain_value`: `stringValue`, then
    /// `boolValue`, `intValue`, `doubleValue`, whatever else the object holds), of the type
    /// `_GYM_TYPES` wants for its key; None for what that path would not read.
    fn fast_plain<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        value: &Members<'_>,
    ) -> Option<Bound<'py, PyAny>> {
        if !key.is_ascii() {
            return None;
        }
        // The last of a member given twice, as Python's parsers keep it.
        let (member, raw) = ["stringValue", "boolValue", "intValue", "doubleValue"]
            .into_iter()
            .find_map(|member| {
                value
                    .iter()
                    .filter(|(name, _)| name == member)
                    .last()
                    .map(|(_, raw)| (member, *raw))
            })?;
        let (plain, class) = value_of(py, member, raw, false)?;
        self.wanted(key, class).then_some(plain)
    }

    fn trace_text<'py>(&self, py: Python<'py>, trace_id: &str) -> Bound<'py, PyString> {
        let Ok(mut last) = self.last_trace.lock() else {
            return PyString::new(py, trace_id);
        };
        if let Some((text, made)) = last.as_ref() {
            if text == trace_id {
                return made.bind(py).clone();
            }
        }
        let made = PyString::new(py, trace_id);
        *last = Some((trace_id.to_owned(), made.clone().unbind()));
        made
    }

    /// The span name's text, made once per name (up to a bound: names without end would only cost
    /// the cache).
    fn span_name<'py>(&self, py: Python<'py>, name: &str) -> Bound<'py, PyString> {
        let Ok(mut names) = self.span_names.lock() else {
            return PyString::intern(py, name);
        };
        if let Some(made) = names.get(name) {
            return made.bind(py).clone();
        }
        let made = PyString::intern(py, name);
        if names.len() >= 4096 {
            names.clear();
        }
        names.insert(name.to_owned(), made.clone().unbind());
        made
    }

    fn wanted(&self, key: &str, class: u8) -> bool {
        self.gym_types
            .get(key)
            .is_none_or(|allowed| allowed & class != 0)
    }

    /// A span attribute's value as `_plain_attributes` reads it: an object of one member, ASCII
    /// text (interned), an integer as digits or a JSON integer, a double, a boolean.
    fn plain<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        value: &Members<'_>,
    ) -> Option<Bound<'py, PyAny>> {
        if !key.is_ascii() {
            return None;
        }
        let (member, raw) = value.single()?;
        if member == "arrayValue" && !self.gym_types.contains_key(key) {
            return array(py, raw);
        }
        let (plain, class) = value_of(py, member, raw, true)?;
        self.wanted(key, class).then_some(plain)
    }

    /// The span's `SpanData`, or None where `_plain_span` (without events) would not read it. With
    /// `lean`, the span as `gymtrace check` holds it (`_read.check.stream.decode_for_check`): with
    /// only the attributes in `lean.keys` and no links, unless the summary readers read it
    /// (`_read.source.summary_span`: a kind of `lean.read_kinds`, or no rollout ID as text); then
    /// whole, and None if it has events and no rollout ID (the Python decoder reads those events).
    /// A span with Ray's task attempt is left to Python too (its re-runs are read there).
    pub fn span<'py>(
        &self,
        py: Python<'py>,
        kept: &Kept<'_>,
        service: &Bound<'py, PyString>,
        instance: &Bound<'py, PyString>,
        lean: Option<&Lean>,
    ) -> Option<Bound<'py, PyAny>> {
        // Read once: a summary reader's span is made again from it, whole, after its lean reading.
        let parsed;
        let s = match kept {
            Kept::Read(s) => s,
            Kept::Text(raw) => {
                parsed = serde_json::from_str::<Object>(raw).ok()?;
                &parsed
            }
        };
        let Some(lean) = lean else {
            return Some(self.made(py, s, service, instance, &Read::Whole)?.0);
        };
        let (span, attributes) = self.made(py, s, service, instance, &Read::Keys(&lean.keys))?;
        if attributes.contains(&lean.ray_attempt).ok()? {
            return None;
        }
        let kind = attributes.get_item(&lean.kind).ok()?;
        let read_kind = match kind.as_ref().map(|k| k.cast::<PyString>()) {
            Some(Ok(kind)) => lean.read_kinds.contains(kind.to_str().ok()?),
            _ => false,
        };
        let rollout = attributes.get_item(&lean.rollout).ok()?;
        let has_rollout = rollout.is_some_and(|r| r.is_instance_of::<PyString>());
        if !read_kind && has_rollout {
            return Some(span);
        }
        let read = if has_rollout {
            Read::Whole
        } else {
            Read::WholeWithEvents
        };
        Some(self.made(py, s, service, instance, &read)?.0)
    }

    fn made<'py>(
        &self,
        py: Python<'py>,
        s: &Object<'_>,
        service: &Bound<'py, PyString>,
        instance: &Bound<'py, PyString>,
        read: &Read<'_>,
    ) -> Option<(Bound<'py, PyAny>, Bound<'py, PyDict>)> {
        if matches!(read, Read::WholeWithEvents)
            && s.events.is_some_and(|e| !matches!(e.get(), "null" | "[]"))
        {
            return None; // events a rule reads: the Python decoder's
        }
        let trace_id = text(s.trace_id?)?;
        let span_id = text(s.span_id?)?;
        let name = text(s.name?)?;
        if !name.is_ascii() || !lower_hex(&span_id, 16) || !lower_hex(&trace_id, 32) {
            return None;
        }
        let parent = match s.parent {
            None => None,
            Some(raw) if is_null(raw) => None,
            Some(raw) => {
                let parent = text(raw)?;
                if parent.is_empty() {
                    None
                } else if lower_hex(&parent, 16) {
                    Some(parent)
                } else {
                    return None;
                }
            }
        };
        let (start, end) = (time(s.start)?, time(s.end)?);
        let kind = match s.kind {
            None => 1,
            Some(raw) => integer(raw)?,
        };
        let kind = self.kinds.get(usize::try_from(kind).ok()?)?;
        let (status, message) = match s.status {
            None => (0, None),
            Some(raw) if is_null(raw) => (0, None),
            Some(raw) if is_object(raw) => {
                let found: Status = serde_json::from_str(raw.get()).ok()?;
                let code = match found.code {
                    None => 0,
                    Some(raw) => integer(raw)?,
                };
                let message = match found.message {
                    None => None,
                    Some(raw) => Some(text(raw).filter(|m| m.is_ascii())?),
                };
                (code, message)
            }
            Some(_) => return None,
        };
        let status = self.statuses.get(usize::try_from(status).ok()?)?;
        let attributes = PyDict::new(py);
        for item in &s.attributes {
            let key = match read {
                Read::Keys(keys) => match keys.get(item.key.as_ref()) {
                    Some(key) => key.bind(py).clone(),
                    None => continue,
                },
                _ => PyString::intern(py, &item.key),
            };
            if item.key == self.nemo_rollout {
                return None; // its attempt suffix is read by the Python reader
            }
            let value = self.plain(py, &item.key, item.value.as_ref()?)?;
            attributes.set_item(key, value).ok()?;
        }
        let mut links = Vec::new();
        let read_links = !matches!(read, Read::Keys(_));
        if let Some(raw) = s.links.filter(|l| read_links && !is_null(l)) {
            let found: Vec<&RawValue> = serde_json::from_str(raw.get()).ok()?;
            for link in found {
                if !is_object(link) {
                    return None;
                }
                let link: Object = serde_json::from_str(link.get()).ok()?;
                let (trace, span) = (text(link.trace_id?)?, text(link.span_id?)?);
                let hex =
                    |t: &str, w: usize| t.len() == w && t.bytes().all(|b| b.is_ascii_hexdigit());
                if !hex(&trace, 32) || !hex(&span, 16) {
                    return None;
                }
                let found = PyDict::new(py);
                for item in &link.attributes {
                    let value = self.fast_plain(py, &item.key, item.value.as_ref()?)?;
                    found
                        .set_item(PyString::intern(py, &item.key), value)
                        .ok()?;
                }
                let made = self
                    .make_link
                    .bind(py)
                    .call1((trace.to_ascii_lowercase(), span.to_ascii_lowercase(), found))
                    .ok()?;
                links.push(made);
            }
        }
        let fields = self.template.bind(py).copy().ok()?;
        let values: [Bound<'py, PyAny>; 14] = [
            self.trace_text(py, &trace_id).into_any(),
            PyString::new(py, &span_id).into_any(),
            match parent {
                Some(p) => PyString::new(py, &p).into_any(),
                None => py.None().into_bound(py),
            },
            self.span_name(py, &name).into_any(),
            start.into_pyobject(py).ok()?.into_any(),
            end.into_pyobject(py).ok()?.into_any(),
            attributes.clone().into_any(),
            self.no_events.bind(py).clone().into_any(),
            PyTuple::new(py, links).ok()?.into_any(),
            status.bind(py).clone().into_any(),
            PyString::new(py, message.as_deref().unwrap_or("")).into_any(),
            service.clone().into_any(),
            kind.bind(py).clone().into_any(),
            instance.clone().into_any(),
        ];
        for (field, value) in self.fields.iter().zip(values) {
            fields.set_item(field.bind(py), value).ok()?;
        }
        let span = self.make_span.bind(py).call1((fields,)).ok()?;
        Some((span, attributes))
    }
}
