"""The operator's surfaces: the admin API and status page, /metrics and the health checks, reloading the configuration."""
