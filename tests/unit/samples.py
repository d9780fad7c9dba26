"""Valid job manifests (plain dicts, as read from YAML) for the unit tests to start from."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from rocmtrain.api.manifests import load_documents

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

_FULL: dict[str, Any] = {
    "apiVersion": "rocmtrain.dev/v1alpha1",
    "kind": "RocmTrainingJob",
    "metadata": {"name": "sample", "namespace": "ml", "uid": "2c1f3c9e-0d4b-4c55-9a43-5f1d8e0c7b21"},
    "spec": {
        "model": {"source": "/models/roberta-base", "numLabels": 3},
        "data": {
            "train": {"uri": "s3://bucket/train.jsonl"},
            "eval": {"uri": "hf://datasets/org/reviews", "split": "test"},
        },
        "resources": {
            "workers": 3,
            "gpusPerWorker": 2,
            "cpusPerWorker": "12500m",
            "memoryPerWorker": "96Gi",
            "sharedMemory": "24Gi",
            "head": {"cpu": "3", "memory": "12Gi"},
            "gpu": {"productName": "AMD_Instinct_MI300X_OAM", "family": "AI", "vram": "192G"},
        },
        "scheduling": {
            "priorityClassName": "training",
            "nodeSelector": {"topology.kubernetes.io/zone": "zone-a"},
            "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "imagePullSecrets": [{"name": "registry"}],
        "env": [
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}},
        ],
        "volumes": [
            {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
            {"name": "ckpt", "persistentVolumeClaim": {"claimName": "checkpoints"}},
        ],
        "volumeMounts": [
            {"name": "models", "mountPath": "/models", "readOnly": True},
            {"name": "ckpt", "mountPath": "/checkpoints"},
        ],
        "checkpoint": {"storagePath": "/checkpoints/sample"},
        "faultTolerance": {"jobRetries": 2, "activeDeadlineSeconds": 7200},
        "lifecycle": {"ttlSecondsAfterFinished": 300},
    },
}

_MINIMAL: dict[str, Any] = {
    "apiVersion": "rocmtrain.dev/v1alpha1",
    "kind": "RocmTrainingJob",
    "metadata": {"name": "minimal"},
    "spec": {
        "model": {"source": "org/model", "numLabels": 2},
        "data": {"train": {"uri": "/data/train.jsonl"}},
        # Not required by the schema, but by every cluster job (the CRD's CEL rule, validate_job).
        "checkpoint": {"storagePath": "s3://checkpoints/minimal"},
    },
}


_LANGUAGE_MODEL: dict[str, Any] = {
    "apiVersion": "rocmtrain.dev/v1alpha1",
    "kind": "RocmTrainingJob",
    "metadata": {"name": "chat-lora", "namespace": "ml"},
    "spec": {
        "model": {
            "source": "/models/llama-3.1-8b",
            "task": "causal-lm",
            "maxSeqLength": 2048,
            "chatTemplate": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}",
        },
        "data": {
            "train": {"uri": "s3://bucket/chats/train.jsonl"},
            "eval": {"uri": "s3://bucket/chats/eval.jsonl", "maxSamples": 256},
            "messagesField": "messages",
        },
        "training": {"lossOn": "response", "packing": True, "learningRate": 2.0e-4, "precision": "bf16"},
        "adapter": {"rank": 16, "alpha": 32, "dropout": 0.05, "targetModules": ["q_proj", "v_proj"], "merge": True},
        "evaluation": {"generate": {"maxNewTokens": 128, "records": 64}},
        "resources": {"workers": 1, "gpusPerWorker": 8},
        "checkpoint": {"storagePath": "s3://checkpoints/chat-lora"},
    },
}


def language_model_job() -> dict[str, Any]:
    """A causal-lm job: LoRA on chat records, with packing and generation."""
    return copy.deepcopy(_LANGUAGE_MODEL)


def full_job() -> dict[str, Any]:
    """A job that sets nearly every field."""
    return copy.deepcopy(_FULL)


def minimal_job() -> dict[str, Any]:
    """A job with only the required fields."""
    return copy.deepcopy(_MINIMAL)


def example(name: str) -> dict[str, Any]:
    """The single job of examples/<name>."""
    (document,) = load_documents((EXAMPLES / name).read_text())
    return document


def documented_commands(name: str) -> list[str]:
    """The commands the header comment of examples/<name> gives (`#   python ...`, `#   rocmtrain run ...`), in
    order, without their trailing remarks."""
    header = (EXAMPLES / name).read_text().split("\napiVersion:", 1)[0]
    return [line[1:].strip().split("  ")[0] for line in header.splitlines() if line.startswith("#   ")]
