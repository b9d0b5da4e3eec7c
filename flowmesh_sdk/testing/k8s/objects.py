"""The emulator's API objects, one import away: ``v1 Status`` errors and names
(:mod:`.meta`), quantities and ResourceQuota accounting (:mod:`.quota`), label and field
selectors (:mod:`.selectors`) and the object store -- one global resourceVersion counter,
an event history, watch fan-out -- (:mod:`.store`).  This module re-exports them all; each
module gives its sources.

Everything here runs on the emulator's event loop (nothing locks): the HTTP handlers and
the kubelet mutate the store, and every change is handed at once to the watchers whose
namespace and selectors it concerns.
"""

from __future__ import annotations

from .meta import LABEL_HELP, SUBDOMAIN_HELP, ApiError, Obj, generate_name, name_errors, now_rfc3339, status_body
from .quota import (TERMINAL, counts_for_quota, format_quantity, parse_quantity, pod_quota_usage, pod_requests,
                    quota_admit, quota_used)
from .selectors import FieldGetter, FieldSelector, LabelSelector, common_fields, match_label_selector, pod_fields
from .store import Event, ObjectStore, Watcher

__all__ = ["ApiError", "FieldSelector", "LabelSelector", "ObjectStore", "Watcher", "format_quantity",
           "match_label_selector", "now_rfc3339", "parse_quantity", "pod_requests", "quota_admit",
           "quota_used", "status_body",
           # also importable from here, as before the split
           "Event", "FieldGetter", "LABEL_HELP", "Obj", "SUBDOMAIN_HELP", "TERMINAL", "common_fields",
           "counts_for_quota", "generate_name", "name_errors", "pod_fields", "pod_quota_usage"]
