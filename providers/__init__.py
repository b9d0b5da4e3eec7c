"""FlowMesh SDK providers: one folder per cloud, each registered as an entry point."""
