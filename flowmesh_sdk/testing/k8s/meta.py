"""The emulator's object basics: the object type, timestamps, ``v1 Status`` errors
(:class:`ApiError`) and object names (validation, ``generateName``).  Sources:
``k8s.io/apimachinery/pkg/api/errors`` (Status bodies: ``pods "x" not found``, ``pods "x"
already exists``, ``NewResourceExpired`` for a too old watch) and
``.../util/validation`` (RFC 1123 names)."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["ApiError", "Obj", "generate_name", "name_errors", "now_rfc3339", "status_body"]

Obj = dict[str, Any]


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---- errors ---------------------------------------------------------------------------
def status_body(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> Obj:
    """A ``v1 Status`` as the apiserver writes an error."""
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": message, "reason": reason}
    if details is not None:
        body["details"] = dict(details)
    body["code"] = code
    return body


class ApiError(Exception):
    """An API error answered as a ``v1 Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = dict(headers or {})

    def body(self) -> Obj:
        return status_body(self.code, self.reason, self.message, self.details)

    @classmethod
    def not_found(cls, resource: str, name: str, group: str = "") -> ApiError:
        what = f"{resource}.{group}" if group else resource
        details: Obj = {"name": name, "kind": resource}
        if group:
            details["group"] = group
        return cls(404, "NotFound", f'{what} "{name}" not found', details)

    @classmethod
    def already_exists(cls, resource: str, name: str, group: str = "") -> ApiError:
        what = f"{resource}.{group}" if group else resource
        details: Obj = {"name": name, "kind": resource}
        if group:
            details["group"] = group
        return cls(409, "AlreadyExists", f'{what} "{name}" already exists', details)

    @classmethod
    def forbidden(cls, resource: str, name: str, why: str, group: str = "") -> ApiError:
        what = f"{resource}.{group}" if group else resource
        details: Obj = {"name": name, "kind": resource}
        if group:
            details["group"] = group
        return cls(403, "Forbidden", f'{what} "{name}" is forbidden: {why}', details)

    @classmethod
    def invalid(cls, kind: str, name: str, causes: list[tuple[str, str]], group: str = "") -> ApiError:
        """422 Invalid; ``causes``: (field, message) pairs as field.ErrorList renders them."""
        text = ", ".join(f"{f}: {m}" for f, m in causes)
        lead = f"{kind}.{group}" if group else kind
        message = f'{lead} "{name}" is invalid: ' + (f"[{text}]" if len(causes) > 1 else text)
        details: Obj = {"name": name, "kind": kind,
                        "causes": [{"reason": _cause_reason(m), "message": m, "field": f} for f, m in causes]}
        if group:
            details["group"] = group
        return cls(422, "Invalid", message, details)

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)


def _cause_reason(message: str) -> str:
    for prefix, reason in (("Required value", "FieldValueRequired"), ("Invalid value", "FieldValueInvalid"),
                           ("Unsupported value", "FieldValueNotSupported"), ("Forbidden", "FieldValueForbidden"),
                           ("Too many", "FieldValueTooMany"), ("Duplicate value", "FieldValueDuplicate")):
        if message.startswith(prefix):
            return reason
    return "FieldValueInvalid"


# ---- names ------------------------------------------------------------------------------
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN_HELP = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                  "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                  "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_HELP = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
              "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
              "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")


def name_errors(name: str, *, label: bool = False) -> list[str]:
    """``metadata.name`` problems (apimachinery's IsDNS1123Subdomain / IsDNS1123Label)."""
    limit = 63 if label else 253
    out = []
    if len(name) > limit:
        out.append(f"must be no more than {limit} characters")
    if not (_DNS1123_LABEL if label else _DNS1123_SUBDOMAIN).match(name):
        out.append(LABEL_HELP if label else SUBDOMAIN_HELP)
    return out


_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"   # apiserver's utilrand alphanumerics


def generate_name(base: str) -> str:
    import secrets
    return base[:58] + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
