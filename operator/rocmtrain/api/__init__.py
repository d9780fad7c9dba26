"""The RocmTrainingJob API contract: models and CRD generation (no kopf, kubernetes, torch or ray)."""
