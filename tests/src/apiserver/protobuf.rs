//! Request bodies in `application/vnd.kubernetes.protobuf`, as kubectl's typed
//! commands (`create namespace`, `create configmap`, `create secret`,
//! `create service` ...) send them, turned into the JSON the store keeps.
//!
//! The body is the magic `k8s\0` and a `runtime.Unknown` envelope holding
//! the apiVersion, the kind and the object's message. The messages are read
//! through the field table in `protobuf_schema.rs`, generated from the
//! k8s-pb and k8s-openapi crates: a table and one walker cost far less code
//! than a conversion per type, and cover every kind the server serves.
//!
//! Protobuf cannot tell a zero value from an unset one for Go's non-pointer
//! fields, which Go writes always. Like Go's JSON with `omitempty`, empty
//! strings, zeros and `false` are left out, so defaulting sees them as unset;
//! a pointer field explicitly set to `0` or `false` is lost with them.

use k8s_openapi::ByteString;
use serde_json::{Map, Value};
use thiserror::Error;

use super::protobuf_schema::{MESSAGES, ROOTS};

/// The prefix of every Kubernetes protobuf body.
const MAGIC: &[u8] = b"k8s\0";

#[derive(Debug, Error)]
pub enum DecodeError {
    #[error("not a Kubernetes protobuf body (no k8s\\0 prefix)")]
    Magic,
    #[error("truncated or malformed protobuf")]
    Malformed,
    #[error("field {0} has the wrong wire type")]
    WireType(&'static str),
    #[error("field {0} is not UTF-8")]
    Utf8(&'static str),
    #[error("field {0} does not hold JSON: {1}")]
    Json(&'static str, serde_json::Error),
    #[error("no protobuf decoding for {api_version:?} {kind:?}")]
    UnknownKind { api_version: String, kind: String },
    #[error("a time before year -9999 or after 9999")]
    Time,
}

pub(super) enum Message {
    /// A message whose JSON is an object of its fields.
    Fields(&'static [Field]),
    /// A message with a JSON form of its own (a time, a quantity ...).
    Special(Kind),
}

pub(super) struct Field {
    pub tag: u32,
    pub json: &'static str,
    pub kind: Kind,
    pub repeated: bool,
}

#[derive(Clone, Copy)]
pub(super) enum Kind {
    Str,
    Bool,
    Int32,
    Int64,
    Double,
    Bytes,
    MapStr,
    MapBytes,
    MapMessage(usize),
    Message(usize),
    /// A Go struct embedded with `json:",inline"`: its fields join the parent's.
    Inline(usize),
    Time,
    MicroTime,
    IntOrString,
    Quantity,
    /// Bytes that are JSON already (RawExtension, FieldsV1, apiextensions JSON).
    Raw,
    SchemaOrArray(usize),
    SchemaOrBool(usize),
    SchemaOrStringArray(usize),
}

/// Decodes a protobuf request body into the object's JSON.
pub fn decode(body: &[u8]) -> Result<Value, DecodeError> {
    let envelope = body.strip_prefix(MAGIC).ok_or(DecodeError::Magic)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for entry in Reader(envelope) {
        match entry? {
            (1, Wire::Bytes(type_meta)) => {
                for entry in Reader(type_meta) {
                    match entry? {
                        (1, Wire::Bytes(b)) => api_version = utf8(b, "apiVersion")?.into(),
                        (2, Wire::Bytes(b)) => kind = utf8(b, "kind")?.into(),
                        _ => {}
                    }
                }
            }
            (2, Wire::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let Some(&(_, _, message)) = ROOTS
        .iter()
        .find(|(v, k, _)| *v == api_version && *k == kind)
    else {
        return Err(DecodeError::UnknownKind { api_version, kind });
    };
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), api_version.into());
    obj.insert("kind".into(), kind.into());
    if let Value::Object(fields) = message_value(message, raw)? {
        obj.extend(fields);
    }
    Ok(Value::Object(obj))
}

fn message_value(message: usize, bytes: &[u8]) -> Result<Value, DecodeError> {
    match &MESSAGES[message] {
        Message::Special(kind) => special(*kind, bytes),
        Message::Fields(fields) => {
            let mut obj = Map::new();
            fields_into(fields, bytes, &mut obj)?;
            Ok(Value::Object(obj))
        }
    }
}

fn fields_into(
    fields: &[Field],
    bytes: &[u8],
    obj: &mut Map<String, Value>,
) -> Result<(), DecodeError> {
    for entry in Reader(bytes) {
        let (tag, wire) = entry?;
        // Fields newer than the table are skipped, as Go skips unknown ones.
        let Some(field) = fields.iter().find(|f| f.tag == tag) else {
            continue;
        };
        match field.kind {
            Kind::Inline(m) => {
                if let Value::Object(inner) = message_value(m, wire.bytes(field.json)?)? {
                    obj.extend(inner);
                }
            }
            Kind::MapStr | Kind::MapBytes | Kind::MapMessage(_) => {
                let (key, value) = map_entry(field, wire.bytes(field.json)?)?;
                let map = obj
                    .entry(field.json)
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(map) = map {
                    map.insert(key, value);
                }
            }
            _ if field.repeated => {
                let items = obj
                    .entry(field.json)
                    .or_insert_with(|| Value::Array(vec![]));
                if let Value::Array(items) = items {
                    match (field.kind, wire) {
                        // Packed scalars: one length-delimited run of varints.
                        (Kind::Int32 | Kind::Int64, Wire::Bytes(run)) => {
                            let mut run = run;
                            while !run.is_empty() {
                                items.push(int(field.kind, varint(&mut run)?));
                            }
                        }
                        _ => items.push(value(field, wire)?),
                    }
                }
            }
            _ => {
                let v = value(field, wire)?;
                if is_zero(&v) {
                    obj.remove(field.json);
                } else {
                    obj.insert(field.json.into(), v);
                }
            }
        }
    }
    Ok(())
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

fn value(field: &Field, wire: Wire) -> Result<Value, DecodeError> {
    let name = field.json;
    Ok(match (field.kind, wire) {
        (Kind::Bool, Wire::Varint(v)) => Value::Bool(v != 0),
        (Kind::Int32 | Kind::Int64, Wire::Varint(v)) => int(field.kind, v),
        (Kind::Double, Wire::Fixed64(v)) => {
            serde_json::Number::from_f64(f64::from_bits(v)).map_or(Value::Null, Value::Number)
        }
        (Kind::Str, Wire::Bytes(b)) => utf8(b, name)?.into(),
        (Kind::Bytes, Wire::Bytes(b)) => base64(b),
        (Kind::Message(m), Wire::Bytes(b)) => message_value(m, b)?,
        _ => return Err(DecodeError::WireType(name)),
    })
}

fn int(kind: Kind, v: u64) -> Value {
    // Negative int32s travel sign-extended to 64 bits, so one cast serves both.
    match kind {
        Kind::Int32 => (v as i64 as i32).into(),
        _ => (v as i64).into(),
    }
}

fn base64(bytes: &[u8]) -> Value {
    serde_json::to_value(ByteString(bytes.to_vec())).expect("bytes serialise")
}

fn map_entry(field: &Field, bytes: &[u8]) -> Result<(String, Value), DecodeError> {
    let (mut key, mut value) = (String::new(), Value::Null);
    for entry in Reader(bytes) {
        match (entry?, field.kind) {
            ((1, Wire::Bytes(b)), _) => key = utf8(b, field.json)?.into(),
            ((2, Wire::Bytes(b)), Kind::MapStr) => value = utf8(b, field.json)?.into(),
            ((2, Wire::Bytes(b)), Kind::MapBytes) => value = base64(b),
            ((2, Wire::Bytes(b)), Kind::MapMessage(m)) => value = message_value(m, b)?,
            _ => return Err(DecodeError::WireType(field.json)),
        }
    }
    // An absent value is the type's zero value.
    if value.is_null() {
        value = match field.kind {
            Kind::MapMessage(m) => message_value(m, &[])?,
            _ => "".into(),
        };
    }
    Ok((key, value))
}

/// The JSON of the messages that are not an object of their fields.
fn special(kind: Kind, bytes: &[u8]) -> Result<Value, DecodeError> {
    let mut ints = [0u64; 3];
    let mut text = String::new();
    let mut raw = None;
    let mut schema = None;
    let mut list = Vec::new();
    for entry in Reader(bytes) {
        match (kind, entry?) {
            (
                Kind::Time | Kind::MicroTime | Kind::IntOrString | Kind::SchemaOrBool(_),
                (t @ 1..=3, Wire::Varint(v)),
            ) => {
                ints[t as usize - 1] = v;
            }
            (Kind::IntOrString, (3, Wire::Bytes(b))) | (Kind::Quantity, (1, Wire::Bytes(b))) => {
                text = utf8(b, "string")?.into();
            }
            (Kind::Raw, (1, Wire::Bytes(b))) => raw = Some(b),
            (Kind::SchemaOrArray(m) | Kind::SchemaOrStringArray(m), (1, Wire::Bytes(b)))
            | (Kind::SchemaOrBool(m), (2, Wire::Bytes(b))) => schema = Some(message_value(m, b)?),
            (Kind::SchemaOrArray(m), (2, Wire::Bytes(b))) => list.push(message_value(m, b)?),
            (Kind::SchemaOrStringArray(_), (2, Wire::Bytes(b))) => {
                list.push(utf8(b, "property")?.into());
            }
            _ => {}
        }
    }
    Ok(match kind {
        // Go writes a zero time as an empty message; its JSON is null.
        Kind::Time | Kind::MicroTime if bytes.is_empty() => Value::Null,
        Kind::Time => timestamp(ints[0], 0)?
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
            .into(),
        Kind::MicroTime => {
            let t = timestamp(ints[0], ints[1])?;
            format!(
                "{}.{:06}Z",
                t.strftime("%Y-%m-%dT%H:%M:%S"),
                t.subsec_microsecond()
            )
            .into()
        }
        Kind::IntOrString if ints[0] == 1 => text.into(),
        Kind::IntOrString => int(Kind::Int32, ints[1]),
        Kind::Quantity => text.into(),
        Kind::Raw => match raw {
            Some(b) if !b.is_empty() => {
                serde_json::from_slice(b).map_err(|e| DecodeError::Json("raw", e))?
            }
            _ => Value::Null,
        },
        Kind::SchemaOrBool(_) => schema.unwrap_or(Value::Bool(ints[0] != 0)),
        Kind::SchemaOrArray(_) | Kind::SchemaOrStringArray(_) if !list.is_empty() => {
            Value::Array(list)
        }
        _ => schema.unwrap_or(Value::Null),
    })
}

fn timestamp(seconds: u64, nanos: u64) -> Result<jiff::Timestamp, DecodeError> {
    jiff::Timestamp::new(seconds as i64, nanos as i32).map_err(|_| DecodeError::Time)
}

fn utf8<'a>(b: &'a [u8], field: &'static str) -> Result<&'a str, DecodeError> {
    std::str::from_utf8(b).map_err(|_| DecodeError::Utf8(field))
}

#[derive(Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32,
    Bytes(&'a [u8]),
}

impl<'a> Wire<'a> {
    fn bytes(self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        match self {
            Wire::Bytes(b) => Ok(b),
            _ => Err(DecodeError::WireType(field)),
        }
    }
}

/// The (field number, value) pairs of one message.
struct Reader<'a>(&'a [u8]);

impl<'a> Iterator for Reader<'a> {
    type Item = Result<(u32, Wire<'a>), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let entry = self.entry();
        if entry.is_err() {
            self.0 = &[];
        }
        Some(entry)
    }
}

impl<'a> Reader<'a> {
    fn entry(&mut self) -> Result<(u32, Wire<'a>), DecodeError> {
        let key = varint(&mut self.0)?;
        let tag = u32::try_from(key >> 3).map_err(|_| DecodeError::Malformed)?;
        let wire = match key & 7 {
            0 => Wire::Varint(varint(&mut self.0)?),
            1 => Wire::Fixed64(u64::from_le_bytes(
                self.take(8)?.try_into().expect("8 bytes"),
            )),
            2 => {
                let len =
                    usize::try_from(varint(&mut self.0)?).map_err(|_| DecodeError::Malformed)?;
                Wire::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Wire::Fixed32
            }
            _ => return Err(DecodeError::Malformed),
        };
        Ok((tag, wire))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

fn varint(buf: &mut &[u8]) -> Result<u64, DecodeError> {
    let mut v = 0u64;
    for (i, &b) in buf.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *buf = &buf[i + 1..];
            return Ok(v);
        }
    }
    Err(DecodeError::Malformed)
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    /// `kubectl create service loadbalancer web --tcp=80:http -n demo`, as
    /// kubectl 1.33 sent it.
    const SERVICE: &[u8] = b"k8s\x00\x0a\x0d\x0a\x02v1\x12\x07Service\x12s\x0a#\x0a\x03web\x12\x00\x1a\x04demo\x22\x00*\x002\x008\x00B\x00Z\x0a\x0a\x03app\x12\x03web\x12H\x0a\x1e\x0a\x0780-http\x12\x03TCP\x18P\x22\x0a\x08\x01\x10\x00\x1a\x04http(\x00\x12\x0a\x0a\x03app\x12\x03web\x1a\x00\x22\x0cLoadBalancer:\x00B\x00R\x00Z\x00`\x00h\x00\x1a\x02\x0a\x00\x1a\x00\x22\x00";

    /// `kubectl create secret generic s --from-literal=pw=x --from-file=raw=<00 ff>`.
    const SECRET: &[u8] = b"k8s\x00\x0a\x0c\x0a\x02v1\x12\x06Secret\x12-\x0a\x15\x0a\x01s\x12\x00\x1a\x04demo\x22\x00*\x002\x008\x00B\x00\x12\x07\x0a\x02pw\x12\x01x\x12\x09\x0a\x03raw\x12\x02\x00\xff\x1a\x00\x1a\x00\x22\x00";

    #[test]
    fn kubectl_service_body_decodes_to_its_json() {
        assert_eq!(
            decode(SERVICE).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "web", "namespace": "demo", "labels": {"app": "web"}},
                "spec": {
                    "ports": [{"name": "80-http", "protocol": "TCP", "port": 80, "targetPort": "http"}],
                    "selector": {"app": "web"},
                    "type": "LoadBalancer",
                },
                "status": {"loadBalancer": {}},
            })
        );
    }

    #[test]
    fn kubectl_secret_body_decodes_bytes_as_base64() {
        assert_eq!(
            decode(SECRET).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "s", "namespace": "demo"},
                "data": {"pw": "eA==", "raw": "AP8="},
            })
        );
    }

    #[test]
    fn special_messages_take_their_json_forms() {
        // Lease: holderIdentity, acquireTime (MicroTime 1700000000.123456s),
        // leaseDurationSeconds -1 (a negative int32 is ten bytes).
        let mut spec = b"\x0a\x01a\x1a\x0b\x08\x80\xe2\xcf\xaa\x06\x10\x80\x94\xef\x3a".to_vec();
        spec.extend(b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01");
        let mut raw = vec![0x12, spec.len() as u8];
        raw.extend(&spec);
        let type_meta = b"\x0a\x16coordination.k8s.io/v1\x12\x05Lease";
        let mut body = b"k8s\x00\x0a".to_vec();
        body.push(type_meta.len() as u8);
        body.extend(type_meta);
        body.push(0x12);
        body.push(raw.len() as u8);
        body.extend(&raw);
        assert_eq!(
            decode(&body).unwrap()["spec"],
            json!({
                "holderIdentity": "a",
                "acquireTime": "2023-11-14T22:13:20.123456Z",
                "leaseDurationSeconds": -1,
            })
        );
    }

    #[test]
    fn bad_bodies_are_errors_not_panics() {
        assert!(matches!(decode(b"{}"), Err(DecodeError::Magic)));
        for cut in 4..SERVICE.len() {
            // Every prefix either decodes or is refused; none panics.
            let _ = decode(&SERVICE[..cut]);
        }
        assert!(matches!(
            decode(&SERVICE[..60]),
            Err(DecodeError::Malformed)
        ));
        let pod_list = b"k8s\x00\x0a\x0d\x0a\x02v1\x12\x07PodList";
        assert!(matches!(
            decode(pod_list),
            Err(DecodeError::UnknownKind { kind, .. }) if kind == "PodList"
        ));
    }
}
