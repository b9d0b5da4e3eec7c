"""``acme``: a provider package that lives only in FlowMesh's tests (``tests/plugins``).

It proves that a provider is one folder: everything the core knows of it is its
descriptor, registered through the entry point in ``../flowmesh_acme-0.1.0.dist-info`` --
installed only while ``tests/_plugins.installed()`` puts ``tests/plugins`` on the path.
The acme "cloud" sells three shapes in one region, priced in its own snapshot
(``catalog.csv``); its machines are capacity-accounted slices of this host (the local
provider's mechanism), so its sandboxes are real containers on this machine.
"""
