"""What the scripts report, for the tests that run them (`sdk_steps.py`: 8 steps, loss 1/step)."""

from __future__ import annotations

SDK_STEPS_LAST_PROGRESS = {"epoch": 1.0, "step": 8, "totalSteps": 8, "percent": 100.0, "etaSeconds": 0.0}
SDK_STEPS_LAST_METRICS = {
    "trainLoss": 0.125,
    "learningRate": 1e-4,
    "evalAccuracy": 1.0,
    "custom": [{"name": "tokens_seen", "value": 4096.0}],
}
