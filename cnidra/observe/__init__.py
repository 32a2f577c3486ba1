"""What every layer may use to be seen: Prometheus metrics, supervised background tasks, and the
/healthz + /metrics endpoint."""
