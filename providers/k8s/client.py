"""The official Kubernetes client (``kubernetes``, the ``k8s`` extra), and why it is this one.

``kubernetes`` is the client the Kubernetes project publishes (kubernetes-client/python),
generated from the API's OpenAPI spec and kept in step with each release; R2E-Gym, dstack
and agent-sandbox's Python client use it.  ``kubernetes_asyncio`` is a community port of the
same generated code onto aiohttp.  This provider uses the official one, like every other
provider here uses its cloud's own SDK: its blocking calls run on the bounded worker threads
of a :class:`~flowmesh_sdk.offloop.OffLoop`, the namespace watches and the held exec streams
on daemon threads of their own (:mod:`.watch`, :mod:`.stream`), so nothing blocks the loop;
and aiohttp stays out of the base install.  Checked with kubernetes 37.0.2.

Facts used: ``Configuration.retries = False`` makes urllib3 raise at once (the client's own
retries off: the provisioner owns them); ``_preload_content=False`` returns the raw response,
read here as JSON (no model objects: a watch event costs a ``json.loads``);
``kubernetes.stream.ws_client.create_websocket`` opens an exec stream offering
``v5.channel.k8s.io`` then ``v4.channel.k8s.io``.

Rate limits: the API server sheds load itself (API Priority and Fairness answers 429 with
``Retry-After``); the client side keeps to :data:`RATES`, an assumption (50 pod creates and
deletes per second, bursts of 100 -- client-go's default for controllers is 5/s, burst 10,
which would make a burst of 256 sandboxes take 50 s; raise or lower it to your cluster's
APF settings).  Describe and list are served from the watches and cost no call.
"""

from __future__ import annotations

from flowmesh_sdk.provider import ApiRate

RATES: tuple[ApiRate, ...] = (
    ApiRate("launch", rate_per_s=50.0, burst=100, per_instance=True),   # one create per pod
    ApiRate("terminate", rate_per_s=50.0, burst=100),
    ApiRate("describe", rate_per_s=100.0, burst=200),
    ApiRate("list", rate_per_s=100.0, burst=200),
)
