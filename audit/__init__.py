"""dqa.audit: dataset readers, vectorized per-sample metrics, the named checks, the scan."""
