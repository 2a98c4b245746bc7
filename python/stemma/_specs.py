"""Job specs from Python dicts or YAML text into `stemma.v1.JobSpec`, read the way the CLI
reads a job file (common/job_spec.cc, common/proto_yaml.cc): the proto's field names (or
their camelCase), `engine: {command: C, spec: {...}}` as `C: {...}`, the flat form of tagged
messages (an eval task's `{type: perplexity, ...}`), whole numbers written as floats (`5e9`),
and one job, several YAML documents, or a mapping with a `jobs:` list. Errors are
InvalidArgument naming the field's path, as the CLI's do."""

import math

import yaml
from google.protobuf.descriptor import FieldDescriptor as _FD

from . import _yaml
from .errors import InvalidArgument
from .v1 import job_pb2, spec_options_pb2


def _repeated(f):
    # protobuf >= 5.28 has is_repeated; `label` is gone from newer releases.
    is_repeated = getattr(f, "is_repeated", None)
    return is_repeated if is_repeated is not None else f.label == _FD.LABEL_REPEATED


def load_yaml_documents(text):
    try:
        return [d for d in _yaml.load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise InvalidArgument(f"not valid YAML: {e}") from None


def jobs_from(value, where="jobs"):
    """A list of JobSpec messages from a dict, a list of dicts, YAML text, or JobSpecs."""
    if isinstance(value, job_pb2.JobSpec):
        return [value]
    if isinstance(value, str):
        docs = load_yaml_documents(value)
        specs = []
        for d, doc in enumerate(docs):
            w = f"{where} document {d + 1}" if len(docs) > 1 else where
            specs.extend(_jobs_of_document(doc, w))
        if not specs:
            raise InvalidArgument(f"{where}: no jobs")
        return specs
    if isinstance(value, dict):
        return _jobs_of_document(value, where)
    if isinstance(value, (list, tuple)):
        specs = []
        for i, item in enumerate(value):
            specs.extend(jobs_from(item, f"{where}[{i}]"))
        return specs
    raise InvalidArgument(f"{where}: give a dict, a list of dicts or YAML text, "
                          f"not {type(value).__name__}")


def _jobs_of_document(doc, where):
    if isinstance(doc, dict) and set(doc) == {"jobs"}:
        if not isinstance(doc["jobs"], list):
            raise InvalidArgument(f"{where}: jobs must be a list")
        return [job_spec(j, f"{where} jobs[{i}]") for i, j in enumerate(doc["jobs"])]
    return [job_spec(doc, where)]


def job_spec(doc, where="job"):
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{where}: a job must be a mapping")
    if "engine" in doc:
        doc = _rewrite_engine_sugar(doc, where)
    spec = job_pb2.JobSpec()
    _Reader(where).message(doc, spec, "")
    return spec


def _rewrite_engine_sugar(doc, where):
    engine = doc["engine"]
    kinds = job_pb2.JobSpec.DESCRIPTOR.oneofs_by_name["kind"].fields
    commands = [f.name for f in kinds if f.name not in ("noop", "exec")]
    if (not isinstance(engine, dict) or "command" not in engine
            or set(engine) - {"command", "spec"}):
        raise InvalidArgument(f"{where}: engine: write {{command: <engine command>, spec: "
                              "{...}} or the command as the kind (e.g. train: {...})")
    if engine["command"] not in commands:
        raise InvalidArgument(f"{where}: engine.command: unknown engine command "
                              f"'{engine['command']}' (commands: {', '.join(commands)})")
    out = {}
    for k, v in doc.items():
        if k == "engine":
            out[engine["command"]] = engine.get("spec") or {}
        else:
            out[k] = v
    return out


def _field(descriptor, key):
    f = descriptor.fields_by_name.get(key)
    if f is None:
        f = descriptor.fields_by_camelcase_name.get(key)
    return f


def _real_oneof(f):
    o = f.containing_oneof
    if o is None:
        return None
    # proto3 `optional` fields live in synthetic oneofs of their own.
    if len(o.fields) == 1 and o.name == "_" + f.name:
        return None
    return o


class _Reader:
    def __init__(self, where):
        self.where = where

    def error(self, path, what):
        text = f"{self.where}: {path}: {what}" if path else f"{self.where}: {what}"
        return InvalidArgument(text)

    def message(self, node, msg, path):
        if node is None:
            return
        if not isinstance(node, dict):
            raise self.error(path, "must be a mapping")
        d = msg.DESCRIPTOR
        tag = d.GetOptions().Extensions[spec_options_pb2.message_rules].tag
        if tag and tag in node:
            return self.tagged(node, msg, path, tag)
        for key, value in node.items():
            key = str(key)
            field_path = f"{path}.{key}" if path else key
            f = _field(d, key)
            if f is None:
                raise self.error(field_path, "unknown field (allowed: "
                                 + ", ".join(x.name for x in d.fields) + ")")
            oneof = f.containing_oneof
            if oneof is not None:
                set_name = msg.WhichOneof(oneof.name)
                if set_name is not None and set_name != f.name:
                    raise self.error(field_path, f"only one of a {oneof.name} may be given "
                                     f"({set_name} is already)")
            inline = bool(tag) and _real_oneof(f) is not None
            self.field(value, msg, f, path if inline else field_path)

    def tagged(self, node, msg, path, tag):
        d = msg.DESCRIPTOR
        kind = node[tag]
        tag_path = f"{path}.{tag}" if path else tag
        members = [f for f in d.fields if _real_oneof(f) is not None and f.message_type]
        member = next((f for f in members if f.name == kind), None)
        if member is None:
            raise self.error(tag_path, f"'{kind if isinstance(kind, str) else ''}' is not one "
                             "of " + ", ".join(f.name for f in members))
        body = getattr(msg, member.name)
        body.SetInParent()
        for key, value in node.items():
            key = str(key)
            if key == tag:
                continue
            field_path = f"{path}.{key}" if path else key
            f = _field(d, key)
            if f is not None and _real_oneof(f) is None:
                self.field(value, msg, f, field_path)
                continue
            own = _field(body.DESCRIPTOR, key)
            if own is not None:
                self.field(value, body, own, field_path)
                continue
            if any(m.message_type.fields_by_name.get(key) for m in members):
                word = "".join(c if not c.isupper() else " " + c for c in d.name).split()[-1]
                raise self.error(field_path,
                                 f"does not apply to a {member.name} {word.lower()}")
            names = [tag] + [x.name for x in d.fields if _real_oneof(x) is None] + \
                [x.name for x in body.DESCRIPTOR.fields]
            raise self.error(field_path, "unknown field (allowed: " + ", ".join(names) + ")")

    def field(self, node, msg, f, path):
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            if node is None:
                return
            if not isinstance(node, dict):
                raise self.error(path, "must be a mapping")
            target = getattr(msg, f.name)
            key_f = f.message_type.fields_by_name["key"]
            value_f = f.message_type.fields_by_name["value"]
            for k, v in node.items():
                entry_path = f"{path}.{k}"
                key = self.scalar(k, key_f, entry_path)
                if value_f.message_type is not None:
                    self.message(v, target[key], entry_path)
                else:
                    target[key] = self.scalar(v, value_f, entry_path)
            return
        if _repeated(f):
            if node is None:
                return
            if not isinstance(node, (list, tuple)):
                raise self.error(path, "must be a list")
            target = getattr(msg, f.name)
            for i, item in enumerate(node):
                item_path = f"{path}[{i}]"
                if f.message_type is not None:
                    self.message(item, target.add(), item_path)
                else:
                    target.append(self.scalar(item, f, item_path, repeated=True))
            return
        if f.message_type is not None:
            sub = getattr(msg, f.name)
            sub.SetInParent()
            self.message(node, sub, path)
            return
        if node is None:
            return  # `field:` / `~`: the default
        setattr(msg, f.name, self.scalar(node, f, path))

    def scalar(self, value, f, path, repeated=False):
        if value is None and repeated:
            value = ""
        if isinstance(value, (dict, list, tuple)):
            raise self.error(path, "must be a single value, not a list or mapping")
        rules = f.GetOptions().Extensions[spec_options_pb2.rules]
        if rules.role == spec_options_pb2.ROLE_LAYER_RANGE and isinstance(value, int) \
                and not isinstance(value, bool):
            raise self.error(path, f'write layer ranges as strings: "{value}" for layer '
                             f'{value} alone, "2:6" for layers 2..5 (half-open)')
        text = _text(value)
        t = f.type
        if t in (_FD.TYPE_STRING, _FD.TYPE_BYTES):
            return text.encode() if t == _FD.TYPE_BYTES else text
        if t in (_FD.TYPE_INT32, _FD.TYPE_INT64, _FD.TYPE_SINT32, _FD.TYPE_SINT64,
                 _FD.TYPE_SFIXED32, _FD.TYPE_SFIXED64, _FD.TYPE_UINT32, _FD.TYPE_UINT64,
                 _FD.TYPE_FIXED32, _FD.TYPE_FIXED64):
            return self.integer(text, f, path)
        if t in (_FD.TYPE_DOUBLE, _FD.TYPE_FLOAT):
            try:
                v = float(text)
            except ValueError:
                v = math.nan
            if not math.isfinite(v):
                raise self.error(path, f"must be a number, not '{text}'")
            return v
        if t == _FD.TYPE_BOOL:
            if text in ("true", "True", "TRUE"):
                return True
            if text in ("false", "False", "FALSE"):
                return False
            raise self.error(path, f"must be true or false, not '{text}'")
        if t == _FD.TYPE_ENUM:
            e = f.enum_type.values_by_name.get(text)
            if e is None and text.lstrip("-").isdigit():
                e = f.enum_type.values_by_number.get(int(text))
            if e is None:
                raise self.error(path, "must be one of "
                                 + ", ".join(v.name for v in f.enum_type.values))
            return e.number
        raise self.error(path, "unsupported field type")

    def integer(self, text, f, path):
        unsigned = f.type in (_FD.TYPE_UINT32, _FD.TYPE_UINT64, _FD.TYPE_FIXED32,
                              _FD.TYPE_FIXED64)
        try:
            v = int(text)
        except ValueError:
            try:
                d = float(text)
            except ValueError:
                d = math.nan
            if unsigned or not math.isfinite(d) or d != math.floor(d) or abs(d) > 9.2e18:
                kind = "a non-negative integer" if unsigned else "an integer"
                raise self.error(path, f"must be {kind}, not '{text}'") from None
            v = int(d)
        bits = 32 if f.type in (_FD.TYPE_INT32, _FD.TYPE_SINT32, _FD.TYPE_SFIXED32,
                                _FD.TYPE_UINT32, _FD.TYPE_FIXED32) else 64
        lo, hi = (0, 2**bits - 1) if unsigned else (-2**(bits - 1), 2**(bits - 1) - 1)
        if not lo <= v <= hi:
            raise self.error(path, f"{text} is out of range")
        return v


def _text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value == math.floor(value) and abs(value) < 1e16:
        return repr(value)
    return str(value)
