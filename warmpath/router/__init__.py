"""The router process: HTTP front, dispatch to workers, relay, registry I/O and the dashboard."""
