"""The ARM emulator's template deployments (``Microsoft.Resources/deployments``), which
``az vm create`` uses: it sends one template holding the virtual network, the NIC and the
VM, and polls the deployment.

Served: ``PUT``/``GET`` of ``.../resourcegroups/RG/providers/Microsoft.Resources/
deployments/NAME`` and its ``operationStatuses/ID``.  A PUT is checked at once (``mode``
``Incremental``, each resource with ``type``, ``name`` and ``apiVersion``, every
``dependsOn`` naming a resource of the template) and answered ``201`` with an
``Azure-AsyncOperation`` URL; the deployment then does what ARM's deployment engine does,
one resource after another in ``dependsOn`` order: it PUTs each resource to the emulator's
own endpoint (a real HTTP call, as ARM calls its resource providers) and follows the
resource's own long-running operation.  The deployment ends ``Succeeded`` with
``outputResources``, or ``Failed`` with ARM's ``DeploymentFailed`` error whose ``details``
carry the failed resource's error.

Not served: template expressions.  A string beginning with ``[`` (``[parameters('x')]``,
``[resourceId(...)]``, ...) is refused with ``400 InvalidTemplate`` naming it, never
deployed as a literal; so are ``copy`` loops, ``condition``, nested deployments and the
``Complete`` mode.  The template az 2.91's ``vm create`` sends has none of them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..httpserver import json_response
from .wire import arm_error, now_iso

__all__ = ["Deployments", "Send"]

#: ``send(method, path_and_query, body) -> (status, headers, json body or None)``
Send = Callable[[str, str, Any], Awaitable[tuple[int, dict[str, str], Any]]]
_KEYS_NOT_SENT = ("type", "name", "apiVersion", "dependsOn", "comments")


def _invalid(message: str) -> web.Response:
    return arm_error(400, "InvalidTemplate", f"Deployment template validation failed: '{message}'.")


def _expression(value: Any, where: str) -> str | None:
    """The path of the first template expression in ``value``, or None."""
    if isinstance(value, str):
        return where if value.startswith("[") and not value.startswith("[[") else None
    if isinstance(value, dict):
        items: list[tuple[str, Any]] = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return None
    return next((found for k, v in items if (found := _expression(v, f"{where}.{k}")) is not None), None)


def _order(resources: list[dict[str, Any]]) -> list[dict[str, Any]] | str:
    """The resources in dependsOn order, or the message of what is wrong."""
    by_ref = {f"{r['type']}/{r['name']}".lower(): r for r in resources}
    out: list[dict[str, Any]] = []
    state: dict[str, str] = {}

    def visit(ref: str, chain: tuple[str, ...]) -> str | None:
        if state.get(ref) == "done":
            return None
        if ref in chain:
            return f"Circular dependency detected on resource: '{ref}'"
        for dep in by_ref[ref].get("dependsOn") or []:
            key = str(dep).lower()
            key = next((k for k in by_ref if key == k or key.endswith("/providers/" + k)), key)
            if key not in by_ref:
                return f"The resource '{dep}' is not defined in the template"
            if (err := visit(key, chain + (ref,))) is not None:
                return err
        state[ref] = "done"
        out.append(by_ref[ref])
        return None
    for ref in by_ref:
        if (err := visit(ref, ())) is not None:
            return err
    return out


class Deployments:
    """Deployments of one subscription; ``send`` calls the emulator's own endpoint."""

    def __init__(self, subscription: str, send: Send) -> None:
        self.subscription = subscription
        self._send = send
        self._items: dict[tuple[str, str], dict[str, Any]] = {}
        self._status: dict[str, dict[str, Any]] = {}      # operation id -> {"status", "error"?}
        self._tasks: set[asyncio.Task[None]] = set()

    def handle(self, request: web.Request, body: bytes, rg: str, name: str, base_url: str) -> web.Response:
        key = (rg.lower(), name.lower())
        if request.method == "GET":
            found = self._items.get(key)
            if found is None:
                return arm_error(404, "DeploymentNotFound", f"Deployment '{name}' could not be found.")
            return json_response(200, found)
        if request.method != "PUT":
            return arm_error(405, "MethodNotAllowed", f"{request.method} of a deployment is not served here")
        try:
            doc = json.loads(body or b"{}")
        except ValueError as exc:
            return arm_error(400, "InvalidRequestContent", f"The request content was invalid: {exc}")
        props = doc.get("properties") or {}
        template = props.get("template")
        if not isinstance(template, dict):
            return arm_error(400, "InvalidRequestContent", "properties.template is required (templateLink is not "
                                                           "served by the emulator)")
        if str(props.get("mode", "")).lower() != "incremental":
            return _invalid(f"mode '{props.get('mode')}' is not served by the emulator: only Incremental")
        resources = template.get("resources")
        if not isinstance(resources, list) or not all(isinstance(r, dict) for r in resources):
            return _invalid("template.resources must be a list of resources")
        for i, r in enumerate(resources):
            missing = [k for k in ("type", "name", "apiVersion") if not r.get(k)]
            if missing:
                return _invalid(f"resources[{i}] has no {', '.join(missing)}")
            for unserved in ("copy", "condition"):
                if unserved in r:
                    return _invalid(f"resources[{i}].{unserved} is not served by the emulator")
            if str(r["type"]).lower() == "microsoft.resources/deployments":
                return _invalid(f"resources[{i}]: nested deployments are not served by the emulator")
            if (where := _expression(r, f"resources[{i}]")) is not None:
                return _invalid(f"{where}: template expressions are not evaluated by the emulator")
        ordered = _order(resources)
        if isinstance(ordered, str):
            return _invalid(ordered)
        rg_id = f"/subscriptions/{self.subscription}/resourceGroups/{rg}"
        op_id = uuid.uuid4().hex
        record: dict[str, Any] = {
            "id": f"{rg_id}/providers/Microsoft.Resources/deployments/{name}", "name": name,
            "type": "Microsoft.Resources/deployments",
            "properties": {"provisioningState": "Running", "mode": "Incremental", "timestamp": now_iso(),
                           "correlationId": str(uuid.uuid4()), "outputs": template.get("outputs") or {},
                           "outputResources": [], "parameters": props.get("parameters") or {}}}
        self._items[key] = record
        self._status[op_id] = {"status": "Running"}
        task = asyncio.get_running_loop().create_task(self._run(record, op_id, rg_id, ordered))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        api = request.query.get("api-version", "")
        return json_response(201, record, {"Azure-AsyncOperation": f"{base_url}{record['id']}/operationStatuses/"
                                                                   f"{op_id}?api-version={api}"})

    def drop_group(self, rg_key: str) -> None:
        """Forget the deployments of a deleted resource group (``rg_key`` lower-case)."""
        for key in [k for k in self._items if k[0] == rg_key]:
            del self._items[key]

    def status(self, op_id: str) -> web.Response:
        found = self._status.get(op_id)
        if found is None:
            return arm_error(404, "NotFound", f"operation {op_id} not found")
        return json_response(200, found)

    async def _run(self, record: dict[str, Any], op_id: str, rg_id: str, resources: list[dict[str, Any]]) -> None:
        props = record["properties"]
        error: dict[str, Any] | None = None
        for r in resources:
            rid = f"{rg_id}/providers/{r['type']}/{r['name']}"
            body = {k: v for k, v in r.items() if k not in _KEYS_NOT_SENT}
            try:
                error = await self._deploy(f"{rid}?api-version={r['apiVersion']}", body)
            except Exception as exc:   # the emulator's own failure: the deployment says so
                error = {"code": "InternalServerError", "message": f"emulator error: {exc!r}"}
            if error is not None:
                break
            props["outputResources"].append({"id": rid})
        props["provisioningState"] = "Failed" if error else "Succeeded"
        props["duration"] = "PT1S"
        status: dict[str, Any] = {"status": props["provisioningState"]}
        if error is not None:
            props["error"] = status["error"] = {
                "code": "DeploymentFailed", "target": record["id"], "details": [error],
                "message": "At least one resource deployment operation failed. Please list deployment operations "
                           "for details."}
        self._status[op_id] = status

    async def _deploy(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """PUT one resource and follow its operation; its ARM error, or None."""
        status, headers, answer = await self._send("PUT", path, body)
        if status >= 400:
            return (answer or {}).get("error") or {"code": str(status), "message": "resource PUT failed"}
        poll = headers.get("Azure-AsyncOperation")
        while poll:
            status, _, answer = await self._send("GET", poll, None)
            state = str((answer or {}).get("status", "Failed"))
            if state == "Succeeded":
                return None
            if state != "InProgress":
                return (answer or {}).get("error") or {"code": "Failed", "message": f"operation {state}"}
            await asyncio.sleep(0.05)
        return None

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
