"""The GCE emulator's wire format where gcloud's everyday commands need it (issue 30), through
the official ``google-cloud-compute`` client (REST transport, anonymous credentials): named
bulk inserts (``perInstanceProperties``), an ``operationGroupId`` that ``zoneOperations.list``
filters by (the bulk's operation and one ``insert`` per instance), operation timestamps stamped once, 400s that name the field (never a Python
repr), and Google's JSON error body for a call the emulator does not serve.  HTTP only: no
instance is booted."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

compute_v1 = pytest.importorskip("google.cloud.compute_v1")

from google.api_core import exceptions as gexc  # noqa: E402
from google.api_core.client_options import ClientOptions  # noqa: E402
from google.auth.credentials import AnonymousCredentials  # noqa: E402

from flowmesh_sdk.testing.gce import GceEmulator  # noqa: E402

ZONE = "us-central1-a"


@pytest.fixture(scope="module")
def gce():
    with GceEmulator() as emu:
        yield emu


def _client(gce, cls):
    return cls(credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=gce.url),
               transport="rest")


def _bulk(gce, **fields) -> compute_v1.Operation:
    body = compute_v1.BulkInsertInstanceResource(
        instance_properties=compute_v1.InstanceProperties(machine_type="e2-standard-2"), **fields)
    return _client(gce, compute_v1.InstancesClient).bulk_insert(project=gce.project, zone=ZONE,
                                                                bulk_insert_instance_resource_resource=body)


def test_a_named_bulk_insert_makes_those_instances_and_its_operation_group_is_listed(gce):
    op = _bulk(gce, count=2, per_instance_properties={
        "alpha": compute_v1.BulkInsertInstanceResourcePerInstanceProperties(),
        "beta": compute_v1.BulkInsertInstanceResourcePerInstanceProperties()})
    op.result(timeout=30)
    assert op.operation_group_id    # the Operation resource's fields, through the client's wrapper
    names = {i.name for i in _client(gce, compute_v1.InstancesClient).list(project=gce.project, zone=ZONE)}
    assert {"alpha", "beta"} <= names
    ops = _client(gce, compute_v1.ZoneOperationsClient)
    grouped = list(ops.list(request=compute_v1.ListZoneOperationsRequest(
        project=gce.project, zone=ZONE, filter=f"operationGroupId={op.operation_group_id}")))
    # the bulk's own operation, then one done insert per instance (what gcloud counts)
    assert grouped[0].name == op.name and grouped[0].operation_type == "bulkInsert"
    inserts = grouped[1:]
    assert sorted(o.target_link.rsplit("/", 1)[-1] for o in inserts) == ["alpha", "beta"]
    assert all(o.operation_type == "insert" and o.status == compute_v1.Operation.Status.DONE and o.target_id
               for o in inserts)
    assert len(list(ops.list(project=gce.project, zone=ZONE))) >= 1


def test_operation_timestamps_are_stamped_once(gce):
    op = _bulk(gce, count=1, name_pattern="stamp-#")
    op.result(timeout=30)
    ops = _client(gce, compute_v1.ZoneOperationsClient)
    first = ops.get(project=gce.project, zone=ZONE, operation=op.name)
    time.sleep(0.05)
    again = ops.get(project=gce.project, zone=ZONE, operation=op.name)
    assert first.insert_time and first.end_time
    assert (first.insert_time, first.start_time, first.end_time) == (again.insert_time, again.start_time,
                                                                     again.end_time)


@pytest.mark.parametrize("fields, field", [
    ({"count": 2}, "resource.namePattern"),                       # no names at all
    ({"count": 1, "name_pattern": "no-hashes"}, "resource.namePattern"),
    ({"count": 5000, "name_pattern": "many-#"}, "resource.count"),
])
def test_a_bad_bulk_insert_is_a_400_naming_the_field(gce, fields, field):
    with pytest.raises(gexc.BadRequest) as ei:
        _bulk(gce, **fields)
    text = str(ei.value)
    assert f"Invalid value for field '{field}'" in text and "KeyError" not in text, text


def test_a_call_not_served_answers_googles_json_error_body(gce):
    url = f"{gce.url}/compute/v1/projects/{gce.project}/global/images"
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(url, timeout=10)
    assert ei.value.code == 404
    body = json.loads(ei.value.read())
    assert body["error"]["code"] == 404 and body["error"]["errors"][0]["reason"] == "notFound"
    assert "does not serve GET" in body["error"]["message"]
