"""A TEST FIXTURE emulating a Kubernetes API server (v1.32) on 127.0.0.1 whose pods are real
podman containers, for a Kubernetes provider's tests and users' offline tests.  It is not
Kubernetes: it serves the calls listed here in the API's own JSON shapes, and the official
clients are pointed at it -- kubectl (through :meth:`KubeEmulator.kubeconfig`) and the
Python client ``kubernetes`` (:meth:`KubeEmulator.api_client`, or ``load_kube_config``)::

    with KubeEmulator(nodes=[Node("n1", cpu="4", memory="16Gi")]) as k8s:
        core = kubernetes.client.CoreV1Api(k8s.api_client())
        core.create_namespaced_pod("default", {...})

Served over HTTPS with a self-signed certificate for 127.0.0.1 (:attr:`KubeEmulator.ca_cert`,
written into the kubeconfig as ``certificate-authority-data``): kubectl's clientcmd uses a
kubeconfig's credentials for TLS servers only, so over ``http://`` (``tls=False``) kubectl
would send no token.  JSON only; every error is a ``v1 Status`` with the apiserver's reason
and message:

* auth -- ``Authorization: Bearer <token>``; anything else is 401 ``Unauthorized`` (as an
  apiserver with ``--anonymous-auth=false``; so kubectl's gcloud dispatcher, which asks
  ``/version`` without credentials to pick a kubectl, falls back to its default one).
* discovery -- ``/version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/G``, ``/apis/G/V`` in
  the legacy shapes (APIVersions, APIResourceList, APIGroupList) answered as
  ``application/json``: client-go takes that for "no aggregated discovery" whatever its
  ``Accept`` asked.  ``/healthz``, ``/livez``, ``/readyz``.  ``/openapi/v3`` is a skeleton:
  the PATCH operations with their ``x-kubernetes-group-version-kind`` and the
  ``fieldValidation`` parameter, which is what ``kubectl create/apply`` look for to leave
  validation to the server (the parameter is then ignored: unknown fields are kept); no
  schemas, no ``/openapi/v2``.
* tables -- ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` (kubectl's get) is
  answered with a ``meta.k8s.io/v1 Table`` for pods and nodes (:mod:`.tables`), lists, gets
  and watches alike; other resources go out as objects (kubectl prints NAME/AGE).
* core/v1 -- namespaces (``default``, ``kube-system``, ``kube-public``, ``kube-node-lease``
  at start; deleting one marks it Terminating, removes its objects, then it), nodes (read
  only: allocatable = capacity from :class:`Node`, ``nvidia.com/gpu`` when ``gpus``, labels
  ``kubernetes.io/hostname`` and ``nvidia.com/gpu.product``/``.count``, Ready True),
  pods (create, get, list, watch, patch/update of labels and annotations, delete,
  deletecollection; ``pods/status``, ``pods/log``, ``pods/exec``, ``pods/eviction``),
  resourcequotas (``status.hard``/``status.used`` computed when read), events (stored;
  the emulator itself writes none, so ``kubectl describe`` shows ``Events: <none>``).
  networking.k8s.io/v1 networkpolicies (stored; the kubelet honours deny-all egress
  only).  node.k8s.io/v1 runtimeclasses (those given as ``runtime_classes``, read only).
* objects -- ``metadata.uid``, ``resourceVersion`` (one global counter, as strings),
  ``creationTimestamp`` (set once); names validated as DNS-1123 subdomains (namespaces and
  container names as labels), label keys and values as apimachinery does (422 Invalid with
  its messages), ``generateName`` (five random characters of the apiserver's alphabet),
  409 AlreadyExists, ``dryRun=All`` on create.  Pods get the defaults that matter
  (restartPolicy Always, imagePullPolicy by tag, requests defaulted from limits, qosClass,
  the not-ready/unreachable tolerations); one container per pod, no init containers (422).
* lists -- ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``, ``k``, ``!k``,
  ``>``/``<``, comma = AND), ``fieldSelector`` (``metadata.name``, ``metadata.namespace``;
  for pods also ``spec.nodeName``, ``status.phase``, ``spec.restartPolicy``, ... with ``=``,
  ``==``, ``!=``; another field is 400 ``field label not supported``), ``limit`` and
  ``continue`` (a page resumes after the last key of the previous one, from the current
  state: not a snapshot), items sorted by namespace/name without kind/apiVersion, as the
  apiserver lists them.  ``resourceVersion``/``resourceVersionMatch`` of a list are ignored.
* watch -- ``watch=1|true`` on any list: newline-delimited ``{"type", "object"}`` over
  chunked transfer.  No ``resourceVersion`` (or ``0``): the current objects as ADDED first;
  ``resourceVersion=N``: the events after N, or, when N is older than the kept history
  (``history`` events, or :meth:`KubeEmulator.compact`), one ERROR event carrying a 410
  Status, reason ``Expired``, ``too old resource version: N (M)`` (the watch cache's
  ``NewResourceExpired``) and the end of the stream.  Selectors apply to the stream as the
  watch cache applies them: an object that stops matching is sent as DELETED, one that
  starts matching as ADDED.  ``allowWatchBookmarks=true``: a BOOKMARK every
  ``bookmark_interval_s`` (object ``{kind, apiVersion, metadata: {resourceVersion}}``);
  ``sendInitialEvents=true`` ends its ADDED events with the bookmark annotated
  ``k8s.io/initial-events-end``; ``timeoutSeconds`` ends the stream (default 1800 s).
* quota -- the ResourceQuota admission plugin's check on pod create: ``spec.hard`` keys
  ``pods``, ``count/pods``, ``requests.cpu``, ``requests.memory``, ``limits.cpu``,
  ``limits.memory``, ``cpu``/``memory`` (= ``requests.``), ``requests.nvidia.com/gpu`` (any
  ``requests.<extended>``), summed over the namespace's non-terminated pods; going over is
  403 Forbidden ``pods "NAME" is forbidden: exceeded quota: Q, requested: requests.cpu=2,
  used: requests.cpu=8, limited: requests.cpu=8`` (only the exceeded keys, canonical
  quantities), and a cpu/memory quota with a container not stating it is ``failed quota: Q:
  must specify requests.cpu for: C``.  Quota scopes are not supported.
* RuntimeClass -- a pod naming a class not configured is 403 ``pods "NAME" is forbidden:
  pod rejected: RuntimeClass "x" not found`` (the RuntimeClass admission plugin); a
  configured one runs with ``podman --runtime HANDLER`` (``runsc``: with the SDK's gVisor
  flags, loopback only).
* eviction -- ``POST pods/NAME/eviction`` (policy/v1 Eviction; no PodDisruptionBudgets):
  a ``DisruptionTarget`` condition (``EvictionByEvictionAPI``), the pod deleted as a DELETE
  would, 201 with a Success Status.
* exec -- WebSocket only (``v5.channel.k8s.io``, ``v4.channel.k8s.io``, ``channel.k8s.io``;
  see :mod:`.exec`), counted as ``count("exec", "pods")``; a
  pod that is not running is 400 before the upgrade (``pod X does not have a host
  assigned``, ``cannot exec into a container in a completed pod; current phase is
  Failed``, ``unable to upgrade connection: container not found ("c")``); a request that
  is no WebSocket upgrade (SPDY) is 400.  ``pods/attach`` is not served (400).
* port-forward -- ``pods/portforward`` over WebSocket, counted as ``count("portforward",
  "pods")``: ``v4.channel.k8s.io`` or no subprotocol (the kubelet's channel pairs, see
  :mod:`.portforward`; the official Python client), and ``SPDY/3.1+portforward.k8s.io``
  (kubectl's ``port-forward``, 1.31+: SPDY/3.1 streams tunnelled in the WebSocket, a data and
  an error stream per forwarded connection, see :mod:`.portforward_spdy` and :mod:`.spdy`);
  each connection made to ``localhost:PORT`` inside the pod's network namespace; a pod that
  is not running is 400 before the upgrade; a direct ``Upgrade: SPDY/3.1`` (kubectl's
  fallback, older kubectls) is 400.
* taints -- ``Node(..., taints=[Taint(key, value, effect)])`` (:mod:`.taints`): served in
  ``spec.taints`` and honoured by the scheduler as kube-scheduler's TaintToleration filter
  (NoSchedule and NoExecute; Equal and Exists), ``node(s) had untolerated taint {K: V}``;
  tolerations are validated on create (422).
* log -- ``podman logs`` of the container (``follow``, ``tailLines``, ``sinceSeconds``,
  ``timestamps`` -- podman's format, ``limitBytes``); a container not started is 400
  ``container "c" in pod "p" is waiting to start: ContainerCreating``; ``previous`` is
  never found.
* throttling -- :meth:`KubeEmulator.throttle`: the next N requests answer 429 with
  ``Retry-After`` and a Status, reason ``TooManyRequests``, ``Too many requests, please try
  again later.`` (``plain=True``: that text as text/plain, which is what the apiserver's
  max-in-flight and priority-and-fairness filters write).

Not served: SPDY upgrades of the HTTP connection (so not kubectl's exec before 1.31, nor the
port-forward of kubectls before 1.31; SPDY tunnelled in a WebSocket is served for port-forward), attach,
PATCH other than merge patch (a strategic merge
patch is applied as a merge patch; server-side apply is 415), protobuf, OpenAPI schemas,
Services, Secrets, ConfigMaps, ServiceAccounts, Deployments and the rest; PATCH/PUT of a
pod's spec; the ``pods/status`` and ``namespaces/finalize`` writes.  Errors aiohttp answers
itself (a malformed request, a body over 64 MiB) are not Status bodies.  Pods: the lifecycle of
:mod:`.scheduler` and :mod:`.kubelet` (scheduling, pulls, podman containers, restarts, eviction,
node loss).

Switches (for tests): :meth:`KubeEmulator.evict` (the kubelet's eviction: phase Failed,
reason Evicted), :meth:`KubeEmulator.lose_node`/``restore_node`` (Ready Unknown, the pods
there Failed with reason NodeLost), :meth:`KubeEmulator.throttle`, :meth:`KubeEmulator.compact`
(watches from before now are 410), :attr:`KubeEmulator.pull_backoff_s` and
``restart_backoff_s`` (the kubelet's back-offs, settable while running),
``bookmark_interval_s``, and HttpServer's ``pause()``/``resume()`` (the API unreachable while
the pods run on).

Counting: :meth:`KubeEmulator.count` ``(verb, resource)``, e.g. ``count("create",
"pods")``, ``count("exec", "pods")``, ``count("watch", "pods")``, so a bench can count the
API calls a sandbox costs (every authenticated request counts, a throttled one too;
non-resource paths count as ``("get", "/version")`` and so on).  For looking inside:
:meth:`KubeEmulator.pods`/``pod`` (the stored objects), :attr:`KubeEmulator.store_root` (give
it to :func:`~flowmesh_sdk.testing.hygiene.containers`), :meth:`KubeEmulator.container_name`,
:attr:`KubeEmulator.pulls`.  :meth:`KubeEmulator.stop` removes every container of the store
(``podman rm -af -t 0``), waits until none of its conmons is left, unmounts and deletes it.
"""

from .scheduler import DEFAULT_NODES, Node
from .server import KubeEmulator
from .taints import Taint

__all__ = ["DEFAULT_NODES", "KubeEmulator", "Node", "Taint"]
