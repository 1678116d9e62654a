#!/usr/bin/env python3
"""Writes tests/src/apiserver/protobuf_schema.rs: the protobuf field table of
the built-in kinds the test server serves.

Field numbers and wire types come from the k8s-pb crate's prost attributes,
JSON field names from k8s-openapi's serde code (the proto names are lost to
prost's snake_case). Run after bumping either crate:

    python3 tests/tools/gen-protobuf-schema.py ~/.cargo/registry/src/*/k8s-pb-0.9.0 \
        ~/.cargo/registry/src/*/k8s-openapi-0.29.0/src/v1_37 > tests/src/apiserver/protobuf_schema.rs
"""
import os
import re
import sys

PB, OPENAPI = sys.argv[1], sys.argv[2]

# (apiVersion, kind) -> message, for the kinds the server serves.
ROOTS = [
    ("v1", "Namespace", "api.core.v1.Namespace"),
    ("v1", "Node", "api.core.v1.Node"),
    ("v1", "Service", "api.core.v1.Service"),
    ("v1", "Endpoints", "api.core.v1.Endpoints"),
    ("v1", "Event", "api.core.v1.Event"),
    ("v1", "ConfigMap", "api.core.v1.ConfigMap"),
    ("v1", "Secret", "api.core.v1.Secret"),
    ("v1", "Pod", "api.core.v1.Pod"),
    ("events.k8s.io/v1", "Event", "api.events.v1.Event"),
    ("discovery.k8s.io/v1", "EndpointSlice", "api.discovery.v1.EndpointSlice"),
    ("coordination.k8s.io/v1", "Lease", "api.coordination.v1.Lease"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition",
     "apiextensions_apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition"),
    ("meta.k8s.io/v1", "DeleteOptions", "apimachinery.pkg.apis.meta.v1.DeleteOptions"),
    ("v1", "DeleteOptions", "apimachinery.pkg.apis.meta.v1.DeleteOptions"),
]

# Messages whose JSON form is not an object of their fields.
SPECIAL = {
    "apimachinery.pkg.apis.meta.v1.Time": "Time",
    "apimachinery.pkg.apis.meta.v1.MicroTime": "MicroTime",
    "apimachinery.pkg.util.intstr.IntOrString": "IntOrString",
    "apimachinery.pkg.api.resource.Quantity": "Quantity",
    "apimachinery.pkg.runtime.RawExtension": "Raw",
    "apimachinery.pkg.apis.meta.v1.FieldsV1": "Raw",
    "apiextensions_apiserver.pkg.apis.apiextensions.v1.Json": "Raw",
    "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaPropsOrArray": "SchemaOrArray",
    "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaPropsOrBool": "SchemaOrBool",
    "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaPropsOrStringArray": "SchemaOrStringArray",
}
SCHEMA = "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaProps"

ATTR = re.compile(r'#\[prost\((.*?)tag = "(\d+)"')
FIELD = re.compile(r'pub (?:r#)?(\w+):(.*)', re.S)
SKIP = {"core", "option", "Option", "prost", "alloc", "string", "String", "vec", "Vec",
        "Box", "boxed", "collections", "BTreeMap", "bytes", ""}

messages = {}  # full name -> [(tag, snake, scalar, repeated, target)]
for root, _, files in os.walk(os.path.join(PB, "src")):
    if "mod.rs" not in files:
        continue
    module = os.path.relpath(root, os.path.join(PB, "src")).split(os.sep)
    text = open(os.path.join(root, "mod.rs")).read()
    for m in re.finditer(r'\npub struct (\w+) \{(?:\}|\n(.*?)\n\})', text, re.S):
        fields = []
        for part in re.split(r'\n\s*///.*|\n(?=\s*#\[prost)', m.group(2) or ""):
            a = ATTR.search(part)
            if not a:
                continue
            spec, tag = a.group(1), int(a.group(2))
            f = FIELD.search(part[a.end():])
            name, ty = f.group(1), re.sub(r'\s+', '', f.group(2)).rstrip(',')
            repeated = "repeated" in spec
            scalar = spec.split(",")[0].split("=")[0].strip()
            target = None
            if spec.startswith("btree_map"):
                scalar = "map_" + spec.split('"')[1].split(",")[1].strip()
            if scalar in ("message", "map_message"):
                path = [p for p in re.split(r'[<>,]', ty) if p and p.split("::")[-1] not in SKIP]
                segs = path[-1].split("::")
                base = list(module)
                while segs[0] == "super":
                    segs.pop(0)
                    base.pop()
                target = ".".join(base + segs) if len(segs) > 1 or segs[0] else None
            fields.append((tag, name, scalar, repeated, target))
        messages[".".join(module + [m.group(1)])] = fields

def json_names(full):
    """snake -> JSON name from k8s-openapi's Deserialize impl of the same type."""
    *module, struct = full.split(".")
    d = os.path.join(OPENAPI, *module)
    if not os.path.isdir(d):
        return {}
    for fn in os.listdir(d):
        if not fn.endswith(".rs"):
            continue
        t = open(os.path.join(d, fn)).read()
        if re.search(r'\npub struct %s\b' % struct, t, re.I):
            names = {norm(k): j for j, k in re.findall(r'"([^"]+)" => Field::Key_(\w+),', t)}
            if "refpath" in names:  # prost keeps `ref`, k8s-openapi says `ref_path`
                names["ref"] = names["refpath"]
            return names
    return {}

def norm(snake):
    """The two crates split acronyms differently (open_apiv3_schema, open_api_v3_schema)."""
    return snake.replace("_", "").lower()

def camel(snake):
    head, *rest = snake.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)

order, seen = [], set()
def visit(full):
    if full in seen:
        return
    seen.add(full)
    order.append(full)
    if full in SPECIAL:
        if SPECIAL[full].startswith("Schema"):
            visit(SCHEMA)
        return
    for _, _, _, _, target in messages[full]:
        if target:
            visit(target)
for _, _, full in ROOTS:
    visit(full)
index = {full: i for i, full in enumerate(order)}

SCALARS = {"string": "Str", "bool": "Bool", "int32": "Int32", "int64": "Int64",
           "double": "Double", "bytes": "Bytes", "map_string": "MapStr", "map_bytes": "MapBytes"}

inlined = {}
out = ["// @generated by tests/tools/gen-protobuf-schema.py from k8s-pb 0.9.0 and",
       "// k8s-openapi 0.29.0. Do not edit.",
       "", "use super::protobuf::{Field, Kind, Message};", "",
       "/// The message of each (apiVersion, kind) the server decodes.",
       "pub(super) const ROOTS: &[(&str, &str, usize)] = &["]
for api, kind, full in ROOTS:
    out.append(f'    ("{api}", "{kind}", {index[full]}),')
out += ["];", "", "pub(super) const MESSAGES: &[Message] = &["]
for full in order:
    if full in SPECIAL:
        k = SPECIAL[full]
        arg = f"({index[SCHEMA]})" if k.startswith("Schema") else ""
        out.append(f'    // {index[full]}: {full.split(".")[-1]}')
        out.append(f'    Message::Special(Kind::{k}{arg}),')
        continue
    names = json_names(full) or inlined.get(full, {})
    out.append(f'    // {index[full]}: {full.split(".")[-1]}')
    out.append('    Message::Fields(&[')
    for tag, snake, scalar, repeated, target in messages[full]:
        js = names.get(norm(snake)) or camel(snake)
        inline = (scalar == "message" and norm(snake) not in names and target not in SPECIAL
                  and any(norm(f[1]) in names for f in messages[target]))
        if norm(snake) not in names and not inline:
            print(f"{full}.{snake}: no JSON name in k8s-openapi, using {js}", file=sys.stderr)
        if inline:
            # A Go struct embedded with `json:",inline"`: a field in protobuf, flat in JSON.
            kind = f"Kind::Inline({index[target]})"
            inlined[target] = names
            js = ""
        elif scalar == "message":
            kind = f"Kind::Message({index[target]})"
        elif scalar == "map_message":
            kind = f"Kind::MapMessage({index[target]})"
        else:
            kind = "Kind::" + SCALARS[scalar]
        out.append(f'        Field {{ tag: {tag}, json: "{js}", kind: {kind}, repeated: {"true" if repeated else "false"} }},')
    out.append("    ]),")
out.append("];")
print("\n".join(out))
