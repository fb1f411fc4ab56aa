"""What operators see of the router: its metrics, the log's context and the spans of traced requests."""
