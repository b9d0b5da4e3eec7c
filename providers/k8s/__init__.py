"""The ``k8s`` provider: sandboxes as pods on the user's Kubernetes clusters, through the
official ``kubernetes`` client (the ``k8s`` extra).

Importing this package does not import ``kubernetes``; the first call does.  See
:mod:`.provider` for what each contract call does, :mod:`.config` for where pods go
(kubeconfig contexts and namespaces, in-cluster service accounts), :mod:`.pods` for the pod
a sandbox is, :mod:`.capacity` for the offers, :mod:`.watch` and :mod:`.stream` for the
one watch per namespace and the held exec stream per pod, :mod:`.errors` for the mapping
onto the SDK's errors, and :mod:`.client` for the choice of client and the rate limits.
"""

from .provider import K8sProvider

__all__ = ["K8sProvider"]
