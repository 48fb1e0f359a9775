"""What a kube-apiserver does with a custom resource on create, without a kube-apiserver.

For an object and the CRD it belongs to (the real CRD YAML of the operator, kept under
``tests/launch/crds/``), ``admit`` follows the apiextensions-apiserver's order on create:

1. **Pruning** - fields the structural schema does not specify are dropped by the server
   (silently, which is why they are an *error* here: the manifest would not do what it says).
   ``x-kubernetes-preserve-unknown-fields`` keeps them; ``additionalProperties`` makes a map;
   ``apiVersion``/``kind``/``metadata`` at the root are always kept.
2. **Defaulting** - ``default`` of every absent property, recursively (a default value is
   itself pruned and defaulted), like ``structuraldefaulting.Default``.
3. **OpenAPI validation** - type (incl. ``x-kubernetes-int-or-string``), ``format`` int32/int64
   ranges, enum, lengths, ``pattern``, min/max, item and property counts, ``required``,
   ``anyOf``/``allOf``/``oneOf``/``not``, and the list types ``set``/``map`` (unique items/keys).
4. **CEL** - every ``x-kubernetes-validations`` rule, evaluated with the
   ``common-expression-language`` package (PyPI; CEL spec implementation in Rust) with
   ``self`` bound to the value at that node. Transition rules (``oldSelf``) only run on update
   and are skipped here, as the server skips them on create.

The root ``metadata`` is checked the way ``ValidateObjectMeta`` does for the parts a manifest
sets (name as a DNS-1123 subdomain, namespace as a label, qualified label keys and values).
Not done here: admission webhooks (each operator's rules are checked in the tests that use
this, with their source lines), CEL cost limits, and server-side ``status`` handling.
"""

from __future__ import annotations

import copy
import gzip
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

CRD_DIR = Path(__file__).resolve().parent / "crds"

_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


@dataclass
class Admission:
    obj: dict  # the object as stored: pruned and defaulted
    errors: list[str] = field(default_factory=list)  # pruning + validation + CEL failures
    defaulted: list[str] = field(default_factory=list)  # paths where a default was applied
    cel_rules_run: int = 0

    def raise_for_errors(self) -> None:
        if self.errors:
            raise AssertionError("the API server would reject or change this object:\n  " + "\n  ".join(self.errors))


@dataclass(frozen=True)
class Crd:
    group: str
    kind: str
    version: str
    schema: dict
    origin: str


@lru_cache(maxsize=None)
def load_crd(relative: str) -> Crd:
    """A CRD fixture (``.yaml`` or ``.yaml.gz``) under ``tests/launch/crds``."""
    path = CRD_DIR / relative
    raw = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    docs = [d for d in yaml.safe_load_all(raw) if d]
    (crd,) = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return Crd(
        group=crd["spec"]["group"],
        kind=crd["spec"]["names"]["kind"],
        version=version["name"],
        schema=version["schema"]["openAPIV3Schema"],
        origin=relative,
    )


def admit(obj: dict, crd: Crd) -> Admission:
    """Prune, default, validate and run the CEL rules, as on ``kubectl apply`` (create)."""
    result = Admission(obj=copy.deepcopy(obj))
    api_version = f"{crd.group}/{crd.version}"
    if obj.get("apiVersion") != api_version or obj.get("kind") != crd.kind:
        result.errors.append(f"expected {api_version} {crd.kind}, got {obj.get('apiVersion')} {obj.get('kind')}")
        return result
    root = result.obj
    metadata = root.get("metadata", {})
    _validate_object_meta(metadata, result)
    body = {k: v for k, v in root.items() if k not in ("apiVersion", "kind", "metadata")}
    body = _prune(body, _without(crd.schema, ("apiVersion", "kind", "metadata")), "", result)
    body = _default(body, crd.schema, "", result)
    root = {"apiVersion": root["apiVersion"], "kind": root["kind"], "metadata": metadata, **body}
    result.obj = root
    _validate(root, crd.schema, "", result, is_root=True)
    return result


# --------------------------------------------------------------------------- pruning


def _without(schema: dict, keys: tuple[str, ...]) -> dict:
    out = dict(schema)
    out["properties"] = {k: v for k, v in schema.get("properties", {}).items() if k not in keys}
    return out


def _prune(value, schema: dict, path: str, result: Admission):
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict) and schema.get("type") == "object" or (isinstance(value, dict) and "properties" in schema):
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = f"{path}.{key}"
            if props is not None and key in props:
                out[key] = _prune(item, props[key], sub, result)
            elif isinstance(additional, dict):
                out[key] = _prune(item, additional, sub, result)
            elif additional is True:
                out[key] = item
            else:
                result.errors.append(f"{sub[1:]}: unknown field, pruned by the API server")
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(item, schema["items"], f"{path}[{i}]", result) for i, item in enumerate(value)]
    return value


# --------------------------------------------------------------------------- defaulting


def _default(value, schema: dict, path: str, result: Admission):
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = _prune(copy.deepcopy(sub["default"]), sub, f"{path}.{key}", result)
                result.defaulted.append(f"{path}.{key}"[1:])
            if key in value:
                value[key] = _default(value[key], sub, f"{path}.{key}", result)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key in list(value):
                if key not in (schema.get("properties") or {}):
                    value[key] = _default(value[key], additional, f"{path}.{key}", result)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_default(item, schema["items"], f"{path}[{i}]", result) for i, item in enumerate(value)]
    return value


# --------------------------------------------------------------------------- validation


def _type_ok(value, schema: dict) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    expected = schema.get("type")
    if value is None:
        return bool(schema.get("nullable"))
    if expected is None:
        return True
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    return checks[expected](value)


def _validate(value, schema: dict, path: str, result: Admission, is_root: bool = False) -> None:
    where = path[1:] or "(root)"
    errors_before = len(result.errors)
    if not _type_ok(value, schema):
        result.errors.append(f"{where}: expected {schema.get('type', 'int-or-string')}, got {type(value).__name__} {value!r}")
        return
    if value is None:
        return
    _value_validations(value, schema, where, result)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            matches = sum(1 for sub in schema[key] if _quiet_ok(value, sub))
            if (key == "anyOf" and matches == 0) or (key == "oneOf" and matches != 1):
                result.errors.append(f"{where}: does not match {key} {schema[key]}")
    for sub in schema.get("allOf", ()):
        _validate(value, {"type": schema.get("type"), **sub}, path, result)
    if "not" in schema and _quiet_ok(value, schema["not"]):
        result.errors.append(f"{where}: must not match {schema['not']}")

    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key in schema.get("required", ()):
            if key not in value:
                result.errors.append(f"{where}: required field {key!r} is missing")
        for key, item in value.items():
            if is_root and key in ("apiVersion", "kind", "metadata"):
                continue
            if key in props:
                _validate(item, props[key], f"{path}.{key}", result)
            elif isinstance(schema.get("additionalProperties"), dict):
                _validate(item, schema["additionalProperties"], f"{path}.{key}", result)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _validate(item, schema["items"], f"{path}[{i}]", result)
        _list_type(value, schema, where, result)

    if len(result.errors) == errors_before:  # the server runs CEL only on schema-valid values
        _cel(value, schema, where, result)


def _quiet_ok(value, schema: dict) -> bool:
    probe = Admission(obj={})
    _validate(value, {**schema, "type": schema.get("type")}, "", probe)
    return not probe.errors


def _value_validations(value, schema: dict, where: str, result: Admission) -> None:
    def fail(message: str) -> None:
        result.errors.append(f"{where}: {message}")

    if "enum" in schema and value not in schema["enum"]:
        fail(f"{value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            fail(f"longer than {schema['maxLength']}")
        if "minLength" in schema and len(value) < schema["minLength"]:
            fail(f"shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            fail(f"{value!r} does not match {schema['pattern']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if schema.get("format") in _INT_RANGES and isinstance(value, int):
            low, high = _INT_RANGES[schema["format"]]
            if not low <= value <= high:
                fail(f"{value} out of {schema['format']} range")
        if "minimum" in schema and (value < schema["minimum"] or (schema.get("exclusiveMinimum") and value == schema["minimum"])):
            fail(f"{value} below minimum {schema['minimum']}")
        if "maximum" in schema and (value > schema["maximum"] or (schema.get("exclusiveMaximum") and value == schema["maximum"])):
            fail(f"{value} above maximum {schema['maximum']}")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            fail(f"more than {schema['maxItems']} items")
        if "minItems" in schema and len(value) < schema["minItems"]:
            fail(f"fewer than {schema['minItems']} items")
    if isinstance(value, dict):
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            fail(f"more than {schema['maxProperties']} properties")
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            fail(f"fewer than {schema['minProperties']} properties")


def _list_type(value: list, schema: dict, where: str, result: Admission) -> None:
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set":
        seen = [repr(v) for v in value]
        if len(set(seen)) != len(seen):
            result.errors.append(f"{where}: duplicate items in a set list")
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen = set()
        for item in value:
            ident = tuple(repr(item.get(k, _map_key_default(schema, k))) for k in keys)
            if ident in seen:
                result.errors.append(f"{where}: duplicate entries for map keys {keys} = {ident}")
            seen.add(ident)


def _map_key_default(schema: dict, key: str):
    return ((schema.get("items") or {}).get("properties") or {}).get(key, {}).get("default")


# --------------------------------------------------------------------------- CEL


@lru_cache(maxsize=None)
def _compiled(rule: str):
    import cel

    return cel.compile(rule)


def _cel(value, schema: dict, where: str, result: Admission) -> None:
    import cel

    for rule in schema.get("x-kubernetes-validations", ()):
        expression = rule["rule"]
        if re.search(r"\boldSelf\b", expression):
            continue  # transition rule: evaluated on update only
        result.cel_rules_run += 1
        try:
            context = cel.Context()
            context.add_variable("self", value)
            ok = _compiled(expression).execute(context)
        except Exception as exc:  # noqa: BLE001 - an evaluation error rejects the object too
            result.errors.append(f"{where}: CEL rule {expression!r} could not be evaluated: {exc}")
            continue
        if ok is not True:
            message = rule.get("message") or f"failed rule: {expression}"
            result.errors.append(f"{where}: {message} (CEL: {expression})")


# --------------------------------------------------------------------------- ObjectMeta


def _validate_object_meta(metadata: dict, result: Admission) -> None:
    known = {"name", "generateName", "namespace", "labels", "annotations", "finalizers", "ownerReferences"}
    for key in metadata:
        if key not in known:
            result.errors.append(f"metadata.{key}: not settable in a manifest")
    name = metadata.get("name", "")
    if not name or len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        result.errors.append(f"metadata.name {name!r}: not a DNS-1123 subdomain")
    namespace = metadata.get("namespace")
    if namespace is not None and (len(namespace) > 63 or not _DNS1123_LABEL.fullmatch(namespace)):
        result.errors.append(f"metadata.namespace {namespace!r}: not a DNS-1123 label")
    for key, value in (metadata.get("labels") or {}).items():
        if not qualified_name(key):
            result.errors.append(f"metadata.labels: key {key!r} is not a qualified name")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            result.errors.append(f"metadata.labels[{key}]: {value!r} is not a label value")
    for key, value in (metadata.get("annotations") or {}).items():
        if not qualified_name(key) or not isinstance(value, str):
            result.errors.append(f"metadata.annotations: {key!r}: {value!r} is not valid")


def qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return bool(name) and len(name) <= 63 and bool(_LABEL_NAME.fullmatch(name))
