"""Protobuf messages into plain Python values: dicts with the proto's field names, enums as
their names ("SUCCEEDED"), 64-bit integers as ints (protobuf's own MessageToDict makes them
strings), unset sub-messages and unset `optional` fields left out."""

from google.protobuf.descriptor import FieldDescriptor as _FD


def _repeated(f):
    is_repeated = getattr(f, "is_repeated", None)
    return is_repeated if is_repeated is not None else f.label == _FD.LABEL_REPEATED


def _value(f, v):
    if f.type == _FD.TYPE_MESSAGE:
        return to_dict(v)
    if f.type == _FD.TYPE_ENUM:
        e = f.enum_type.values_by_number.get(v)
        return e.name if e is not None else v
    return v


def to_dict(msg):
    out = {}
    for f in msg.DESCRIPTOR.fields:
        v = getattr(msg, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            value_f = f.message_type.fields_by_name["value"]
            out[f.name] = {k: _value(value_f, x) for k, x in v.items()}
        elif _repeated(f):
            out[f.name] = [_value(f, x) for x in v]
        elif f.has_presence and not msg.HasField(f.name):
            continue
        else:
            out[f.name] = _value(f, v)
    return out
