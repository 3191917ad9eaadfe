"""What the integration scenarios share: a deterministic training job, clusters, and waiting helpers."""
