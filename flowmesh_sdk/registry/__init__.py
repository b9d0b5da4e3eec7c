"""OCI registry client: references, credentials, manifest resolution."""
