"""Seeing what a fleet does: logging setup (:mod:`.logs`), Prometheus metrics
(:mod:`.metrics`, extra ``[metrics]``) and OpenTelemetry spans (:mod:`.tracing`)."""
