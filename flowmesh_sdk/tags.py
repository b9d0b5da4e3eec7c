"""How a provider carries the SDK's ownership tags on its cloud.

The core speaks in SDK tags (``flowmesh:fleet`` = ``default``, ...).  Clouds differ in
what a tag may be, so each provider declares a :class:`TagCodec` in its capabilities and
uses it at the edge: ``encode`` before a launch or a tag filter, ``decode`` on what the
cloud lists.  Equal SDK tags always encode to equal cloud tags, so filtering by encoded
value finds exactly what was launched with it.

* :class:`PlainTags` -- key/value tags with length limits (EC2: keys up to 128 chars,
  values up to 256; Azure: names up to 512, values up to 256; Alibaba: 128/128).
* :class:`LabelTags` -- GCE labels: keys and values only lowercase letters, digits, ``_``
  and ``-``, at most 63 characters, keys starting with a letter.  Characters outside
  ``[a-z0-9-]`` are written ``_`` + two hex digits (``_`` itself is ``_5f``), which is
  reversible; a value that would still be longer than 63 characters is cut and suffixed
  with a hash of the whole value, which is not (``decode`` then returns the encoded form,
  and filtering by the same SDK value still matches).
* :class:`SingleLabel` -- one free-text label per instance (Vast.ai): all tags as one
  compact, sorted JSON object.
* :class:`KubeLabels` -- Kubernetes labels: ``flowmesh:fleet`` becomes the key
  ``flowmesh.io/fleet`` (other keys go under ``tags.flowmesh.io/``), names and values
  escaped as :class:`LabelTags` does and, where that would start or end with ``_``/``-``
  or start with ``z``, wrapped in ``z...z`` (label names and values must start and end
  with a letter or digit: kubernetes.io/docs/concepts/overview/working-with-objects/labels).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import SpecError


class TagCodec:
    """Identity codec: the cloud takes the SDK's tags as they are."""

    def encode(self, tags: Mapping[str, str]) -> dict[str, str]:
        return dict(tags)

    def decode(self, tags: Mapping[str, str]) -> dict[str, str]:
        return dict(tags)

    def encode_launch(self, tags: Mapping[str, str], *, limit: int, cloud: str, per: str = "instance"
                      ) -> dict[str, str]:
        """:meth:`encode` for a launch request: a bad tag is a ``SpecError`` naming
        ``launch.<field>``, and more than ``limit`` encoded tags is one naming
        ``launch.tags`` ("``cloud`` allows ``limit`` tags per ``per``")."""
        try:
            out = self.encode({str(k): str(v) for k, v in tags.items()})
        except SpecError as exc:
            raise SpecError(f"launch.{exc.field}", str(exc).split(": ", 1)[-1]) from exc
        if len(out) > limit:
            raise SpecError("launch.tags", f"{cloud} allows {limit} tags per {per}, got {len(out)}")
        return out


@dataclass(frozen=True, slots=True)
class PlainTags(TagCodec):
    max_key: int = 128
    max_value: int = 256

    def encode(self, tags: Mapping[str, str]) -> dict[str, str]:
        for k, v in tags.items():
            if len(k) > self.max_key:
                raise SpecError(f"tags[{k!r}]", f"tag keys are at most {self.max_key} characters here")
            if len(v) > self.max_value:
                raise SpecError(f"tags[{k!r}]", f"tag values are at most {self.max_value} characters here, "
                                                f"got {len(v)}")
        return dict(tags)


_LABEL_OK = re.compile(r"[a-z0-9-]")
_ESCAPE = re.compile(r"_([0-9a-f]{2})")
LABEL_MAX = 63


def _label_escape(text: str) -> str:
    out = []
    for ch in text:
        if _LABEL_OK.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode())
    return "".join(out)


def _label_unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text).encode("latin-1").decode("utf-8", "replace")


_HASHED = re.compile(r"--[0-9a-f]{10}$")   # the end of a value cut to fit (LabelTags._fit)


@dataclass(frozen=True, slots=True)
class LabelTags(TagCodec):
    """GCE-style labels (see the module docstring)."""

    def _fit(self, escaped: str) -> str:
        if len(escaped) <= LABEL_MAX:
            return escaped
        digest = hashlib.sha256(escaped.encode()).hexdigest()[:10]
        return f"{escaped[:LABEL_MAX - 12]}--{digest}"

    def encode(self, tags: Mapping[str, str]) -> dict[str, str]:
        out = {}
        for k, v in tags.items():
            key = _label_escape(k)
            if not key or not key[0].isalpha() or len(key) > LABEL_MAX:
                raise SpecError(f"tags[{k!r}]", "label keys must start with a letter and encode to at most "
                                                f"{LABEL_MAX} characters")
            out[key] = self._fit(_label_escape(v))
        return out

    def decode(self, tags: Mapping[str, str]) -> dict[str, str]:
        out = {}
        for k, v in tags.items():
            value = v if _HASHED.search(v) and len(v) == LABEL_MAX else _label_unescape(v)
            out[_label_unescape(k)] = value
        return out


@dataclass(frozen=True, slots=True)
class SingleLabel(TagCodec):
    """All tags in one free-text label, under the key :attr:`key` on the cloud side."""

    key: str = "label"
    max_len: int = 1024

    def encode(self, tags: Mapping[str, str]) -> dict[str, str]:
        text = json.dumps(dict(sorted(tags.items())), separators=(",", ":"), ensure_ascii=True)
        if len(text) > self.max_len:
            raise SpecError("tags", f"the tags encode to {len(text)} characters; the label holds {self.max_len}")
        return {self.key: text}

    def decode(self, tags: Mapping[str, str]) -> dict[str, str]:
        text = tags.get(self.key)
        if not text:
            return {}
        try:
            data = json.loads(text)
        except ValueError:
            return {}   # a label someone else wrote: carries no SDK tags
        if not isinstance(data, dict):
            return {}
        return {str(k): str(v) for k, v in data.items()}

    def matches(self, label: str | None, wanted: Mapping[str, str]) -> bool:
        """Whether an instance's label carries every tag of ``wanted`` (the cloud cannot
        filter on a part of a label, so the provider lists and filters here)."""
        have = self.decode({self.key: label or ""})
        return all(have.get(k) == v for k, v in wanted.items())


__all__ = ["LABEL_MAX", "LabelTags", "PlainTags", "SingleLabel", "TagCodec"]


KUBE_PREFIX = "flowmesh.io/"
KUBE_OTHER = "tags.flowmesh.io/"


@dataclass(frozen=True, slots=True)
class KubeLabels(LabelTags):
    """Kubernetes labels (see the module docstring): reversible unless cut to 63 characters."""

    @staticmethod
    def _wrap(escaped: str) -> str:
        if escaped and (not escaped[0].isalnum() or not escaped[-1].isalnum() or escaped[0] == "z"):
            return f"z{escaped}z"
        return escaped

    @staticmethod
    def _unwrap(text: str) -> str:
        if len(text) == LABEL_MAX and _HASHED.search(text):
            return text
        return _label_unescape(text[1:-1] if text.startswith("z") else text)

    def encode(self, tags: Mapping[str, str]) -> dict[str, str]:
        out = {}
        for k, v in tags.items():
            prefix, name = (KUBE_PREFIX, k.removeprefix("flowmesh:")) if k.startswith("flowmesh:") else (KUBE_OTHER, k)
            key = self._wrap(_label_escape(name))
            if not key or len(key) > LABEL_MAX:
                raise SpecError(f"tags[{k!r}]", f"label names must encode to 1..{LABEL_MAX} characters")
            out[prefix + key] = self._fit(self._wrap(_label_escape(v)))
        return out

    def decode(self, tags: Mapping[str, str]) -> dict[str, str]:
        out = {}
        for k, v in tags.items():
            if k.startswith(KUBE_PREFIX):
                out["flowmesh:" + self._unwrap(k[len(KUBE_PREFIX):])] = self._unwrap(v)
            elif k.startswith(KUBE_OTHER):
                out[self._unwrap(k[len(KUBE_OTHER):])] = self._unwrap(v)
        return out
