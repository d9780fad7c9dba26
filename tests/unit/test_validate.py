"""validate_job: every bad input is refused at its field path, or rendered inert."""

from __future__ import annotations

import errno
import json
import re
import shlex
import subprocess
from typing import Any

import pytest
import yaml

from rocmtrain.api import crd
from rocmtrain.api.job_config import JOB_CONFIG_LIMIT, job_config_json, job_config_size
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.api.models.chat_template_args import RESERVED_RULE
from rocmtrain.api.models.volumes import VOLUME_SOURCES
from rocmtrain.api.patterns import TEMPLATE_VARIABLE
from rocmtrain.api.validate import SHARED_VOLUMES, UNSHARED_VOLUMES, FieldError, check_derived_names, validate_job
from rocmtrain.render import ENTRYPOINT, render_rayjob, render_rayjob_yaml
from unit.edits import Edit, both, drop, put
from unit.samples import example, full_job, minimal_job

LONG_NAME = "a" * 41
# A valid search; the cases below spoil one part of it.
TUNING: dict[str, Any] = {
    "searchSpace": {
        "learningRate": {"min": 1e-5, "max": 1e-3},
        "batchSizePerWorker": [8, 16],
        "warmupRatio": {"min": 0.0, "max": 0.2},
        "weightDecay": {"min": 0.0, "max": 0.1},
        "epochs": [1, 2],
    },
    "numTrials": 4,
    "maxConcurrentTrials": 2,
}


def tuning(*edits: Edit) -> Edit:
    """Put TUNING into the job, then apply `edits` to it."""

    def edit(manifest: dict[str, Any]) -> None:
        manifest["spec"]["tuning"] = json.loads(json.dumps(TUNING))
        for more in edits:
            more(manifest)

    return edit


TS = "spec.tuning.searchSpace"
# Own training code (spec.code) instead of the built-in loop, and an argument as long as one may be.
CODE = put("spec.code", {"command": ["python", "/code/train.py"]})
LONGEST_ARGUMENT = "x" * 4096


def lm(*edits: Edit) -> Edit:
    """Make the job a causal-lm job on instruction pairs, then apply `edits` to it."""
    return both(
        put("spec.model", {"source": "/models/llama", "task": "causal-lm"}),
        put("spec.data.promptField", "prompt"),
        put("spec.data.responseField", "response"),
        *edits,
    )


def chat_lm(*edits: Edit) -> Edit:
    """Make the job a causal-lm job on chats, then apply `edits` to it."""
    return both(
        put("spec.model", {"source": "/models/llama", "task": "causal-lm"}),
        put("spec.data.messagesField", "messages"),
        *edits,
    )


ARGS = "spec.data.chatTemplateArgs"
ATTENTION = "spec.training.attentionImplementation"
# (id, edit of full_job(), path of the error, words of its message)
# A label key whose prefix is one character over the 253 Kubernetes allows.
LONG_PREFIX_KEY = f"{'a' * 254}/zone"
INVALID: list[tuple[str, Edit, str, str]] = [
    ("workers-string", put("spec.resources.workers", "4"), "spec.resources.workers", "valid integer"),
    ("workers-zero", put("spec.resources.workers", 0), "spec.resources.workers", "greater than or equal to 1"),
    ("workers-negative", put("spec.resources.workers", -2), "spec.resources.workers", "greater than or equal to 1"),
    ("workers-fraction", put("spec.resources.workers", 1.5), "spec.resources.workers", "valid integer"),
    ("workers-too-many", put("spec.resources.workers", 5000), "spec.resources.workers", "less than or equal"),
    ("gpus-fraction", put("spec.resources.gpusPerWorker", 0.5), "spec.resources.gpusPerWorker", "valid integer"),
    ("gpus-bool", put("spec.resources.gpusPerWorker", True), "spec.resources.gpusPerWorker", "valid integer"),
    ("gpus-too-many", put("spec.resources.gpusPerWorker", 17), "spec.resources.gpusPerWorker", "less than or equal"),
    ("precision-unknown", put("spec.training.precision", "fp8"), "spec.training.precision", "'fp32', 'bf16'"),
    ("lr-zero", put("spec.training.learningRate", 0), "spec.training.learningRate", "greater than 0"),
    ("lr-word", put("spec.training.learningRate", "fast"), "spec.training.learningRate", "valid number"),
    ("epochs-null", put("spec.training.epochs", None), "spec.training.epochs", "valid integer"),
    ("pull-policy", put("spec.imagePullPolicy", "Sometimes"), "spec.imagePullPolicy", "'Always'"),
    ("data-missing", drop("spec.data"), "spec.data", "data is required unless code runs your own training code"),
    ("model-missing", drop("spec.model"), "spec.model", "model is required unless code runs your own training code"),
    ("train-missing", drop("spec.data.train"), "spec.data.train", "required field is missing"),
    ("source-missing", drop("spec.model.source"), "spec.model.source", "required field is missing"),
    ("uri-traversal", put("spec.data.train.uri", "/data/../etc/passwd"), "spec.data.train.uri", "'..'"),
    ("source-traversal", put("spec.model.source", "s3://b/../../x"), "spec.model.source", "'..'"),
    ("mount-traversal", put("spec.volumeMounts[0].mountPath", "/mnt/../etc"), "spec.volumeMounts[0].mountPath", ".."),
    ("subpath-traversal", put("spec.volumeMounts[0].subPath", "../keys"), "spec.volumeMounts[0].subPath", "'..'"),
    ("uri-semicolon", put("spec.data.train.uri", "s3://b/x;rm -rf /"), "spec.data.train.uri", "metacharacters"),
    # The training image cannot open az:// (pyarrow reads Azure as abfs://), so validation refuses it.
    ("uri-az-scheme", put("spec.data.train.uri", "az://c/train.jsonl"), "spec.data.train.uri", "s3://, gs://"),
    ("source-subshell", put("spec.model.source", "$(curl evil)"), "spec.model.source", "metacharacters"),
    ("storage-backtick", put("spec.checkpoint.storagePath", "/ckpt/`id`"), "spec.checkpoint.storagePath", "absolute"),
    ("uri-newline", put("spec.data.eval.uri", "s3://b/x\nrm"), "spec.data.eval.uri", "metacharacters"),
    ("image-shell", put("spec.image", "img:1; rm -rf /"), "spec.image", "container image reference"),
    ("env-name-dash", put("spec.env[0].name", "BAD-NAME"), "spec.env[0].name", "environment variable name"),
    ("env-name-newline", put("spec.env[0].name", "A\nB"), "spec.env[0].name", "environment variable name"),
    ("env-value-nul", put("spec.env[0].value", "a\x00b"), "spec.env[0].value", "NUL"),
    ("name-too-long", put("metadata.name", LONG_NAME), "metadata.name", "at most 40 characters"),
    ("name-leading-digit", put("metadata.name", "1job"), "metadata.name", "start with a letter"),
    ("name-uppercase", put("metadata.name", "Job"), "metadata.name", "DNS-1123 label"),
    ("name-shell", put("metadata.name", "job;reboot"), "metadata.name", "DNS-1123 label"),
    ("unknown-field", put("spec.trainng", {}), "spec.trainng", "unknown field"),
    ("api-version", put("apiVersion", "rocmtrain.dev/v1"), "apiVersion", "rocmtrain.dev/v1alpha1"),
    ("kind", put("kind", "Job"), "kind", "RocmTrainingJob"),
    ("labels-missing", drop("spec.model.numLabels"), "spec.model.numLabels", "required when task"),
    ("tune-lr-zero", tuning(put(f"{TS}.learningRate.min", 0)), f"{TS}.learningRate.min", "greater than 0"),
    ("tune-lr-reversed", tuning(put(f"{TS}.learningRate.min", 0.01)), f"{TS}.learningRate.min", "less than max"),
    ("tune-lr-word", tuning(put(f"{TS}.learningRate.max", "big")), f"{TS}.learningRate.max", "valid number"),
    ("tune-wd-above-1", tuning(put(f"{TS}.weightDecay.max", 2)), f"{TS}.weightDecay.max", "less than or equal to 1"),
    ("tune-warmup-above", tuning(put(f"{TS}.warmupRatio.max", 0.8)), f"{TS}.warmupRatio.max", "at most 0.5"),
    ("tune-batch-empty", tuning(put(f"{TS}.batchSizePerWorker", [])), f"{TS}.batchSizePerWorker", "at least 1"),
    (
        "tune-batch-zero",
        tuning(put(f"{TS}.batchSizePerWorker", [0])),
        f"{TS}.batchSizePerWorker[0]",
        "greater than or equal to 1",
    ),
    ("tune-batch-repeat", tuning(put(f"{TS}.batchSizePerWorker", [8, 8])), f"{TS}.batchSizePerWorker", "repeat"),
    ("tune-epochs-float", tuning(put(f"{TS}.epochs", [1.5])), f"{TS}.epochs[0]", "valid integer"),
    ("tune-space-empty", tuning(put(TS, {})), TS, "at least one hyper-parameter"),
    ("tune-space-unknown", tuning(put(f"{TS}.dropout", [0.1])), f"{TS}.dropout", "unknown field"),
    ("tune-trials-zero", tuning(put("spec.tuning.numTrials", 0)), "spec.tuning.numTrials", "greater than or equal"),
    (
        "tune-concurrency",
        tuning(put("spec.tuning.maxConcurrentTrials", 5)),
        "spec.tuning.maxConcurrentTrials",
        "must not exceed numTrials",
    ),
    ("tune-metric-unknown", tuning(put("spec.tuning.metric", "bleu")), "spec.tuning.metric", "'evalAccuracy'"),
    ("tune-metric-task", tuning(put("spec.tuning.metric", "evalMse")), "spec.tuning.metric", "does not produce"),
    (
        "tune-metric-regression",
        both(
            tuning(put("spec.tuning.metric", "evalAccuracy")),
            put("spec.model.task", "regression"),
            drop("spec.model.numLabels"),
        ),
        "spec.tuning.metric",
        "evalLoss, evalMse",
    ),
    ("tune-no-eval", both(tuning(), drop("spec.data.eval")), "spec.data.eval", "ranks trials by evaluation"),
    ("tune-mode", tuning(put("spec.tuning.mode", "best")), "spec.tuning.mode", "'max' or 'min'"),
    ("tune-scheduler", tuning(put("spec.tuning.scheduler.type", "PBT")), "spec.tuning.scheduler.type", "'ASHA'"),
    (
        "tune-reduction",
        tuning(put("spec.tuning.scheduler.reductionFactor", 1)),
        "spec.tuning.scheduler.reductionFactor",
        "greater than or equal to 2",
    ),
    ("labels-one", put("spec.model.numLabels", 1), "spec.model", "at least 2"),
    (
        "regression-labels",
        both(put("spec.model.task", "regression"), put("spec.model.numLabels", 3)),
        "spec.model.numLabels",
        "1 or unset",
    ),
    ("gpu-model-on-cpu", put("spec.resources.gpusPerWorker", 0), "spec.resources.gpu", "requires gpusPerWorker"),
    (
        "env-value-and-secret",
        put("spec.env[2].value", "x"),
        "spec.env[2]",
        "either value or valueFrom",
    ),
    (
        "volume-two-sources",
        put("spec.volumes[0].emptyDir", {}),
        "spec.volumes[0]",
        "exactly one source",
    ),
    (
        "volume-hostpath",
        put("spec.volumes[0]", {"name": "h", "hostPath": {"path": "/"}}),
        "spec.volumes[0].hostPath",
        "unknown field",
    ),
    (
        "volume-source-nested-field",
        put("spec.volumes[0]", {"name": "models", "emptyDir": {"sizeLimit": "1Gi", "k0": {"k1": "v"}}}),
        "spec.volumes[0].emptyDir.k0",
        "unknown field",
    ),
    (
        "volume-items",
        put("spec.volumes[0]", {"name": "c", "configMap": {"name": "c", "items": [{"key": "k", "path": "p"}] * 65}}),
        "spec.volumes[0].configMap.items",
        "at most 64 items",
    ),
    (
        "volume-csi-attributes",
        put(
            "spec.volumes[0]",
            {"name": "c", "csi": {"driver": "d", "volumeAttributes": {f"k{i}": "v" for i in range(33)}}},
        ),
        "spec.volumes[0].csi.volumeAttributes",
        "at most 32",
    ),
    (
        "volume-nfs-server",
        put("spec.volumes[0]", {"name": "n", "nfs": {"server": "$(reboot)", "path": "/x"}}),
        "spec.volumes[0].nfs.server",
        "DNS-1123 subdomain",
    ),
    (
        "volume-file-mode",
        put("spec.volumes[0]", {"name": "s", "secret": {"secretName": "s", "defaultMode": 0o1777}}),
        "spec.volumes[0].secret.defaultMode",
        "511",
    ),
    (
        "volume-source-string",
        put("spec.volumes[0].persistentVolumeClaim", "models"),
        "spec.volumes[0].persistentVolumeClaim",
        "must be an object",
    ),
    ("mount-no-volume", put("spec.volumeMounts[0].name", "nope"), "spec.volumeMounts", "missing: nope"),
    ("mount-duplicate", put("spec.volumeMounts[1].mountPath", "/models"), "spec", "paths must be unique"),
    ("env-duplicate", put("spec.env[1].name", "HF_HUB_OFFLINE"), "spec", "env names must be unique"),
    (
        "queue-without-shutdown",
        both(put("spec.scheduling.queueName", "q"), put("spec.lifecycle", {"shutdownAfterJobFinishes": False})),
        "spec.lifecycle.shutdownAfterJobFinishes",
        "Kueue",
    ),
    (
        "suspend-without-shutdown",
        both(put("spec.suspend", True), put("spec.lifecycle", {"shutdownAfterJobFinishes": False})),
        "spec.suspend",
        "requires lifecycle.shutdownAfterJobFinishes",
    ),
    (
        "gpu-partition-unknown",
        put("spec.resources.gpu", {"partition": "xpx_nps3"}),
        "spec.resources.gpu.partition",
        "an AMD GPU partition",
    ),
    (
        "gpu-resource-not-amd",
        put("spec.resources.gpu", {"resourceName": "nvidia.com/gpu"}),
        "spec.resources.gpu.resourceName",
        "an AMD device plugin resource",
    ),
    (
        "gpu-resource-not-the-partition",
        put("spec.resources.gpu", {"partition": "cpx_nps4", "resourceName": "amd.com/spx_nps1"}),
        "spec.resources.gpu.resourceName",
        "resourceName must be amd.com/<partition>",
    ),
    (
        "topology-without-queue",
        put("spec.scheduling.topology", {"level": "cloud.provider.com/topology-rack"}),
        "spec.scheduling.topology",
        "topology needs scheduling.queueName",
    ),
    (
        "topology-level-not-a-label",
        both(put("spec.scheduling.queueName", "q"), put("spec.scheduling.topology", {"level": "rack name"})),
        "spec.scheduling.topology.level",
        "label key",
    ),
    (
        "topology-level-too-long",
        both(put("spec.scheduling.queueName", "q"), put("spec.scheduling.topology", {"level": "a" * 64})),
        "spec.scheduling.topology.level",
        "",
    ),
    (
        "topology-mode",
        both(
            put("spec.scheduling.queueName", "q"),
            put("spec.scheduling.topology", {"level": "cloud.provider.com/topology-rack", "mode": "strict"}),
        ),
        "spec.scheduling.topology.mode",
        "required",
    ),
    (
        "suspend-queued",
        both(put("spec.suspend", True), put("spec.scheduling.queueName", "q")),
        "spec.suspend",
        "Kueue owns its RayJob's suspend",
    ),
    (
        "ttl-without-shutdown",
        put("spec.lifecycle.shutdownAfterJobFinishes", False),
        "spec.lifecycle.ttlSecondsAfterFinished",
        "requires shutdownAfterJobFinishes",
    ),
    ("env-owned", put("spec.env[0].name", "ROCMTRAIN_JOB"), "spec.env[0].name", "set by the operator"),
    ("env-ray-devices", put("spec.env[0].name", "HIP_VISIBLE_DEVICES"), "spec.env[0].name", "Ray"),
    ("env-ray-address", put("spec.env[0].name", "RAY_ADDRESS"), "spec.env[0].name", "KubeRay"),
    (
        "volume-reserved",
        both(put("spec.volumes[1].name", "dshm"), put("spec.volumeMounts[1].name", "dshm")),
        "spec.volumes[1].name",
        "reserved",
    ),
    ("mount-over-shm", put("spec.volumeMounts[1].mountPath", "/dev/shm"), "spec.volumeMounts[1].mountPath", "reserved"),
    ("shm-too-big", put("spec.resources.sharedMemory", "97Gi"), "spec.resources.sharedMemory", "must not exceed"),
    ("cpu-zero", put("spec.resources.cpusPerWorker", "0"), "spec.resources.cpusPerWorker", "greater than zero"),
    ("cpu-integer", put("spec.resources.cpusPerWorker", 8), "spec.resources.cpusPerWorker", "valid string"),
    ("memory-gb", put("spec.resources.memoryPerWorker", "64GB"), "spec.resources.memoryPerWorker", "quantity"),
    ("head-memory-zero", put("spec.resources.head.memory", "0Gi"), "spec.resources.head.memory", "greater than"),
    ("storage-hub", put("spec.checkpoint.storagePath", "org/ckpt"), "spec.checkpoint.storagePath", "object-store"),
    ("storage-unmounted", put("spec.checkpoint.storagePath", "/tmp/ckpt"), "spec.checkpoint.storagePath", "writable"),
    ("storage-readonly", put("spec.checkpoint.storagePath", "/models/c"), "spec.checkpoint.storagePath", "writable"),
    ("uri-relative", put("spec.data.train.uri", "./data/train.jsonl"), "spec.data.train.uri", "`rocmtrain run`"),
    ("split-not-hub", put("spec.data.train.split", "train"), "spec.data.train.split", "hub data sets only"),
    (
        "selector-key",
        put("spec.scheduling.nodeSelector", {"bad key": "v"}),
        'spec.scheduling.nodeSelector["bad key"]',
        "key must be a label key",
    ),
    (
        "selector-value",
        put("spec.scheduling.nodeSelector", {"zone": "a b"}),
        "spec.scheduling.nodeSelector.zone",
        "label value",
    ),
    (
        "toleration-op",
        put("spec.scheduling.tolerations[0].operator", "In"),
        "spec.scheduling.tolerations[0].operator",
        "",
    ),
    (
        "priority-class",
        put("spec.scheduling.priorityClassName", "Bad_Name"),
        "spec.scheduling.priorityClassName",
        "DNS",
    ),
    ("queue-shell", put("spec.scheduling.queueName", "q;reboot"), "spec.scheduling.queueName", "DNS-1123 subdomain"),
    ("queue-over-label", put("spec.scheduling.queueName", "q" * 64), "spec.scheduling.queueName", "at most 63"),
    (
        "kueue-priority-over-label",
        put("spec.scheduling.kueuePriorityClass", "p" * 64),
        "spec.scheduling.kueuePriorityClass",
        "at most 63",
    ),
    (
        "selector-key-prefix",
        put("spec.scheduling.nodeSelector", {LONG_PREFIX_KEY: "v"}),
        f'spec.scheduling.nodeSelector["{LONG_PREFIX_KEY}"]',
        "prefix is at most 253",
    ),
    (
        "toleration-key-prefix",
        put("spec.scheduling.tolerations", [{"key": LONG_PREFIX_KEY, "operator": "Exists"}]),
        "spec.scheduling.tolerations[0].key",
        "prefix is at most 253",
    ),
    ("gpu-product-shell", put("spec.resources.gpu.productName", "$(x)"), "spec.resources.gpu.productName", "label"),
    (
        "rdma-without-resource",
        put("spec.resources.network", {"ibHca": ["mlx5_0"]}),
        "spec.resources.network.rdmaResource",
        "need rdmaResource when workers > 1",
    ),
    (
        "network-shell",
        put("spec.resources.network", {"networks": ["roce;reboot"]}),
        "spec.resources.network.networks[0]",
        "secondary network",
    ),
    ("hca-shell", put("spec.resources.network.ibHca", ["$(x)"]), "spec.resources.network.ibHca[0]", "HCA name"),
    (
        "interface-too-long",
        put("spec.resources.network.socketInterface", "a" * 16),
        "spec.resources.network.socketInterface",
        "interface name",
    ),
    ("gid-too-large", put("spec.resources.network.gidIndex", 256), "spec.resources.network.gidIndex", "less than"),
    ("lm-task-unknown", put("spec.model.task", "seq2seq"), "spec.model.task", "causal-lm"),
    ("sharding-unknown", put("spec.training.sharding", "zero3"), "spec.training.sharding", "'none' or 'fsdp'"),
    (
        "sharding-fp16",
        both(put("spec.training.sharding", "fsdp"), put("spec.training.precision", "fp16")),
        "spec.training.precision",
        "use bf16",
    ),
    ("lm-labels", lm(put("spec.model.numLabels", 2)), "spec.model.numLabels", "predicts tokens"),
    (
        "lm-template-on-classifier",
        put("spec.model.chatTemplate", "{{ messages }}"),
        "spec.model.chatTemplate",
        "for task causal-lm",
    ),
    ("lm-template-too-long", lm(put("spec.model.chatTemplate", "x" * 16_385)), "spec.model.chatTemplate", "16384"),
    ("lm-prompt-alone", lm(drop("spec.data.responseField")), "spec.data.promptField", "go together"),
    ("lm-template-args-on-pairs", lm(put(ARGS, {"enable_thinking": "false"})), ARGS, "for chat records"),
    ("lm-template-args-reserved", chat_lm(put(ARGS, {"tokenize": "true"})), ARGS, "apply_chat_template sets itself"),
    ("lm-template-args-key", chat_lm(put(ARGS, {"enable-thinking": "1"})), f'{ARGS}["enable-thinking"]', "variable"),
    ("lm-template-args-unquoted", chat_lm(put(ARGS, {"enable_thinking": False})), f"{ARGS}.enable_thinking", "quote"),
    ("lm-template-args-long", chat_lm(put(ARGS, {"name": "x" * 1025})), f"{ARGS}.name", "at most 1024 characters"),
    ("lm-template-args-many", chat_lm(put(ARGS, {f"k{i}": "1" for i in range(17)})), ARGS, "at most 16"),
    ("lm-two-shapes", lm(put("spec.data.messagesField", "messages")), "spec.data.messagesField", "not both"),
    ("lm-fields-on-classifier", put("spec.data.messagesField", "m"), "spec.data", "for task causal-lm"),
    ("lm-packing-on-classifier", put("spec.training.packing", True), "spec.training", "for task causal-lm"),
    ("lm-budget-on-classifier", put("spec.training.tokensPerWorker", 512), "spec.training", "for task causal-lm"),
    ("lm-varlen-on-classifier", put(ATTENTION, "varlen"), "spec.training", "for task causal-lm"),
    ("lm-loss-on-classifier", put("spec.training.lossImplementation", "chunked"), "spec.training", "causal-lm"),
    ("lm-budget-small", lm(put("spec.training.tokensPerWorker", 64)), "spec.training.tokensPerWorker", "maxSeqLength"),
    ("lm-budget-huge", lm(put("spec.training.tokensPerWorker", 2**21)), "spec.training.tokensPerWorker", "1048576"),
    (
        "lm-loss-unknown",
        lm(put("spec.training.lossImplementation", "liger")),
        "spec.training.lossImplementation",
        "fused",
    ),
    (
        "lm-varlen-packing",
        lm(put(ATTENTION, "varlen"), put("spec.training.packing", True)),
        "spec.training.packing",
        "two layouts",
    ),
    ("lm-drop-on-classifier", put("spec.data.truncation", "drop"), "spec.data.truncation", "for task causal-lm"),
    ("truncation-unknown", lm(put("spec.data.truncation", "keep")), "spec.data.truncation", "'cut' or 'drop'"),
    ("lm-adapter-on-classifier", put("spec.adapter", {"rank": 8}), "spec.adapter", "for task causal-lm"),
    ("lm-text-pairs", lm(put("spec.data.textPairField", "b")), "spec.data.textPairField", "classification"),
    (
        "lm-response-loss-on-text",
        lm(drop("spec.data.promptField"), drop("spec.data.responseField"), put("spec.training.lossOn", "response")),
        "spec.training.lossOn",
        "plain-text records have none",
    ),
    ("lm-loss-on-unknown", lm(put("spec.training.lossOn", "prompt")), "spec.training.lossOn", "'response' or 'all'"),
    ("lm-rank-zero", lm(put("spec.adapter", {"rank": 0})), "spec.adapter.rank", "greater than or equal to 1"),
    ("lm-rank-huge", lm(put("spec.adapter", {"rank": 4096})), "spec.adapter.rank", "less than or equal to 1024"),
    ("lm-dropout-one", lm(put("spec.adapter", {"dropout": 1.0})), "spec.adapter.dropout", "less than 1"),
    (
        "lm-module-shell",
        lm(put("spec.adapter", {"targetModules": ["q_proj; rm -rf /"]})),
        "spec.adapter.targetModules[0]",
        "module name",
    ),
    (
        "lm-all-linear-and-names",
        lm(put("spec.adapter", {"targetModules": ["all-linear", "q_proj"]})),
        "spec.adapter.targetModules",
        "stands alone",
    ),
    (
        "lm-too-many-modules",
        lm(put("spec.adapter", {"targetModules": [f"m{i}" for i in range(65)]})),
        "spec.adapter.targetModules",
        "at most 64",
    ),
    (
        "lm-generate-without-eval",
        lm(drop("spec.data.eval"), put("spec.evaluation.generate", {})),
        "spec.evaluation.generate",
        "held-out prompts",
    ),
    (
        "lm-generate-on-text",
        lm(drop("spec.data.promptField"), drop("spec.data.responseField"), put("spec.evaluation.generate", {})),
        "spec.evaluation.generate",
        "held-out prompts",
    ),
    (
        "lm-generate-tokens",
        lm(put("spec.evaluation.generate", {"maxNewTokens": 0})),
        "spec.evaluation.generate.maxNewTokens",
        "greater than or equal to 1",
    ),
    (
        "lm-rank-search-without-adapter",
        both(lm(), tuning(put(f"{TS}.adapterRank", [4, 8]))),
        f"{TS}.adapterRank",
        "needs spec.adapter",
    ),
    (
        "lm-rank-search-repeats",
        both(lm(put("spec.adapter", {})), tuning(put(f"{TS}.adapterRank", [4, 4]))),
        f"{TS}.adapterRank",
        "must not repeat",
    ),
    (
        "lm-accuracy-metric",
        both(lm(), tuning(put("spec.tuning.metric", "evalAccuracy"))),
        "spec.tuning.metric",
        "does not produce evalAccuracy",
    ),
    (
        "lm-exact-match-without-generate",
        both(lm(), tuning(put("spec.tuning.metric", "evalExactMatch"))),
        "spec.tuning.metric",
        "set spec.evaluation.generate",
    ),
    # With spec.code, the built-in loop's fields are refused even where the job's model would take them.
    ("code-tuning", both(CODE, tuning()), "spec.tuning", "runs the built-in loop, not your own code"),
    ("code-adapter", both(CODE, lm(put("spec.adapter", {}))), "spec.adapter", "adapter is the built-in loop's"),
    ("code-packing", both(CODE, lm(put("spec.training.packing", True))), "spec.training.packing", "built-in loop's"),
    ("code-loss-on", both(CODE, lm(put("spec.training.lossOn", "all"))), "spec.training.lossOn", "built-in loop's"),
    ("code-budget", both(CODE, lm(put("spec.training.tokensPerWorker", 512))), "spec.training.packing", "batches"),
    (
        "code-loss-kernel",
        both(CODE, lm(put("spec.training.lossImplementation", "model"))),
        "spec.training.lossImplementation",
        "built-in loop's",
    ),
    (
        "code-generate",
        both(CODE, lm(put("spec.evaluation.generate", {}))),
        "spec.evaluation.generate",
        "your code evaluates its own model",
    ),
    (
        "code-fsdp",
        both(CODE, put("spec.training.sharding", "fsdp")),
        "spec.training.sharding",
        "your code chooses its own strategy",
    ),
    # The rules between a model and its data hold where a job with code gives both.
    ("code-lm-fields", both(CODE, put("spec.data.messagesField", "m")), "spec.data", "for task causal-lm"),
]


@pytest.mark.parametrize(("edit", "path", "words"), [case[1:] for case in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_job_is_refused_at_its_field(edit: Edit, path: str, words: str) -> None:
    manifest = full_job()
    edit(manifest)
    job, errors = validate_job(manifest)
    assert job is None
    assert [e for e in errors if e.path == path and words in e.message], errors


# Every spelling of the operator's mount paths (and of the paths holding them) the runtime resolves alike.
RESERVED_SPELLINGS = [
    "/dev/shm",
    "/dev/shm/",
    "/dev//shm",
    "/dev/./shm",
    "//dev/shm",
    "/dev/shm/ray",
    "/dev",
    "/",
    "//",
    "/.",
    "/var/run/secrets/rocmtrain.dev/progress",
    "/var/run/secrets/rocmtrain.dev//progress",
    "/var/run/secrets/rocmtrain.dev/./progress/",
    "/var/run/secrets/rocmtrain.dev/progress/token",
    "/var/run/secrets",
    "/var",
    "/tmp",
    "/./tmp/",
    "/tmp/ray",
]


@pytest.mark.parametrize("path", RESERVED_SPELLINGS)
def test_reserved_mount_paths_are_refused_however_spelled(path: str) -> None:
    manifest = full_job()
    put("spec.volumeMounts[1].mountPath", path)(manifest)
    job, errors = validate_job(manifest)
    assert job is None
    assert [e for e in errors if e.path == "spec.volumeMounts[1].mountPath" and "reserved" in e.message], errors


@pytest.mark.parametrize("path", ["/dev/shmem", "/tmpdata", "/var/run/secrets/other", "/var/run/rocmtrain", "/data"])
def test_paths_beside_the_reserved_ones_are_fine(path: str) -> None:
    manifest = full_job()
    put("spec.volumeMounts[1].mountPath", path)(manifest)
    put("spec.checkpoint.storagePath", path + "/ckpt")(manifest)
    job, errors = validate_job(manifest)
    assert job is not None, errors


def test_table_is_large_enough() -> None:
    assert len(INVALID) >= 30
    assert len({case[0] for case in INVALID}) == len(INVALID)


def test_every_error_is_reported_at_once() -> None:
    manifest = full_job()
    both(
        put("spec.resources.workers", 0),
        put("spec.training.precision", "fp8"),
        put("spec.image", "a b"),
        put("spec.env[0].name", "1X"),
        put("spec.bogus", 1),
    )(manifest)
    _, errors = validate_job(manifest)
    assert {e.path for e in errors} == {
        "spec.resources.workers",
        "spec.training.precision",
        "spec.image",
        "spec.env[0].name",
        "spec.bogus",
    }


@pytest.mark.parametrize("document", [None, [], "job", 3])
def test_a_job_must_be_a_mapping(document: Any) -> None:
    assert validate_job(document) == (
        None,
        [FieldError("", "a job must be a mapping with apiVersion, kind, metadata and spec")],
    )


def test_field_error_text() -> None:
    assert str(FieldError("spec.resources.workers", "too small")) == "spec.resources.workers: too small"
    assert str(FieldError("", "not a mapping")) == "not a mapping"


def test_valid_jobs_pass() -> None:
    for manifest in (full_job(), minimal_job(), example("cluster-mi300x.yaml"), example("kueue.yaml")):
        job, errors = validate_job(manifest)
        assert errors == []
        assert job is not None


def _with_env(count: int, length: int) -> dict[str, Any]:
    manifest = minimal_job()
    manifest["spec"]["env"] = [{"name": f"V{i}", "value": "x" * length} for i in range(count)]
    return manifest


def test_a_job_too_large_for_its_drivers_variable_is_refused_whole() -> None:
    # 62 values of 4,096 characters, each within its own bound, would make ROCMTRAIN_JOB 257 KB.
    job, errors = validate_job(_with_env(62, 4096))
    assert job is None and [e.path for e in errors] == ["spec"]
    words = r"the job is 25\d,\d{3} bytes as its driver reads it \(ROCMTRAIN_JOB\), at most 98,304: .*"
    assert re.fullmatch(words, errors[0].message)
    # 20 of them (82 KB) pass, and every pod's environment of the RayJob stays under Linux's limit.
    job, errors = validate_job(_with_env(20, 4096))
    assert errors == [] and job is not None
    rayjob = render_rayjob(job)
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    (config,) = [v["value"] for v in head["env"] if v["name"] == "ROCMTRAIN_JOB"]
    assert 80_000 < len(config.encode()) <= 98_304


def test_a_job_is_sized_with_the_uid_the_api_server_will_give_it() -> None:
    """`rocmtrain validate` and the operator agree at the limit: before creation a job has no uid."""
    manifest = _with_env(23, 4096)
    manifest["spec"]["env"].append({"name": "FILL", "value": ""})
    fill = JOB_CONFIG_LIMIT - job_config_size(RocmTrainingJob.model_validate(manifest))
    assert 0 < fill <= 4096
    manifest["spec"]["env"][-1]["value"] = "x" * fill
    manifest["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    stored = RocmTrainingJob.model_validate(manifest)
    assert len(job_config_json(stored).encode()) == job_config_size(stored) == JOB_CONFIG_LIMIT
    assert validate_job(manifest)[1] == []
    del manifest["metadata"]["uid"]
    assert validate_job(manifest)[1] == []  # the same job before it is created
    manifest["spec"]["env"][-1]["value"] += "x"
    assert [e.path for e in validate_job(manifest)[1]] == ["spec"]


def test_linux_refuses_an_environment_string_over_128_kib() -> None:
    """Why the bound exists: execve fails (E2BIG) for one `NAME=value` longer than MAX_ARG_STRLEN."""
    with pytest.raises(OSError) as refused:
        subprocess.run(["true"], env={"ROCMTRAIN_JOB": "x" * (128 * 1024)}, check=False)
    assert refused.value.errno == errno.E2BIG
    subprocess.run(["true"], env={"ROCMTRAIN_JOB": "x" * 98_304}, check=True)


# --- context: cluster or local -------------------------------------------------------


def test_relative_paths_are_for_local_runs_only() -> None:
    quickstart = example("quickstart.yaml")
    job, errors = validate_job(quickstart, context="local")
    assert errors == []
    assert job is not None
    _, errors = validate_job(quickstart, context="cluster")
    assert [e.path for e in errors] == ["spec.data.train.uri", "spec.data.eval.uri", "spec.checkpoint.storagePath"]
    local_storage = example("quickstart.yaml")
    local_storage["spec"]["checkpoint"] = {"storagePath": "./runs/quickstart"}
    assert validate_job(local_storage, context="local")[1] == []
    assert [e.path for e in validate_job(local_storage)[1]][-1] == "spec.checkpoint.storagePath"


def test_cluster_jobs_need_shared_checkpoint_storage_and_local_runs_do_not() -> None:
    """Workers upload their own checkpoints from their pods: a cluster job names storage they all reach."""
    manifest = minimal_job()
    drop("spec.checkpoint")(manifest)
    assert validate_job(manifest, context="local")[1] == []
    (error,) = validate_job(manifest)[1]
    assert error.path == "spec.checkpoint.storagePath"
    for words in ("required for a cluster job", "s3://", "writable volume in spec.volumeMounts", "ReadWriteMany"):
        assert words in error.message


def test_relative_paths_still_may_not_escape() -> None:
    quickstart = example("quickstart.yaml")
    quickstart["spec"]["data"]["train"]["uri"] = "./../secrets.jsonl"
    _, errors = validate_job(quickstart, context="local")
    assert [(e.path, e.message) for e in errors] == [("spec.data.train.uri", "must not contain '..' path segments")]


# --- derived names ------------------------------------------------------------------------


@pytest.mark.parametrize("group", ["gpu", "cpu"])
def test_longest_allowed_name_gives_valid_derived_names(group: str) -> None:
    assert list(check_derived_names("a" * 40, group)) == []


def test_derived_names_that_break_dns_limits_are_reported() -> None:
    errors = list(check_derived_names("a" * 50, "gpu"))
    reported = " ".join(e.message for e in errors)
    for what in ("RayJob", "RayCluster", "RayCluster head Service", "worker pod"):
        assert f"the {what} name" in reported
    assert all(e.path == "metadata.name" for e in errors)
    assert "submitter Job" not in reported


def test_name_at_the_limit_validates_and_renders() -> None:
    manifest = full_job()
    manifest["metadata"]["name"] = "a" + "-b" * 19 + "c"
    job, errors = validate_job(manifest)
    assert errors == []
    assert job is not None
    assert render_rayjob(job)["metadata"]["name"] == manifest["metadata"]["name"]


# --- shell metacharacters: refused or inert ----------------------------------------------

PAYLOADS = ["x; rm -rf /", "$(rm -rf /)", "`reboot`", "line\nbreak", "a && b", "'\"", "x|y", "../../etc/passwd"]


def _string_fields(schema: dict[str, Any], doc: Any, path: str) -> list[str]:
    """Paths of every string field (and map key) in `schema` that `doc` holds a container for."""
    kind = schema.get("type")
    if kind == "string":
        return [path]
    if kind == "array" and isinstance(doc, list):
        found: dict[str, str] = {}  # each field once, in the first item that has it
        for index, item in enumerate(doc):
            for field in _string_fields(schema["items"], item, f"{path}[{index}]"):
                found.setdefault(re.sub(r"\[\d+\]", "[]", field), field)
        return list(found.values())
    if kind == "object" and isinstance(doc, dict):
        if "properties" in schema:
            return [
                found
                for name, sub in schema["properties"].items()
                for found in _string_fields(
                    sub, doc.get(name, {} if sub.get("type") == "object" else None), f"{path}.{name}"
                )
                if sub.get("type") != "object" or name in doc
            ]
        if isinstance(schema.get("additionalProperties"), dict):
            return [f"{path}.<key>", f"{path}.<value>"]
    return []


def _all_strings_job() -> dict[str, Any]:
    manifest = full_job()
    manifest["spec"]["data"].update({"textPairField": "pair", "train": {"uri": "hf://datasets/o/d", "split": "train"}})
    manifest["spec"]["scheduling"]["tolerations"] = [
        {"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute", "tolerationSeconds": 5}
    ]
    manifest["spec"]["scheduling"].update({"queueName": "q", "kueuePriorityClass": "p"})
    manifest["spec"]["volumeMounts"][0]["subPath"] = "sub"
    manifest["spec"]["data"]["eval"]["format"] = "jsonl"
    return manifest


STRING_FIELDS = _string_fields(crd.openapi_schema()["properties"]["spec"], _all_strings_job()["spec"], "spec")


def _inject(manifest: dict[str, Any], field: str, payload: str) -> str:
    """Put `payload` into `field`; return the path an error about it must carry."""
    if field.endswith((".<key>", ".<value>")):
        parent = field.rsplit(".", 1)[0]
        put(parent, {payload: "v"} if field.endswith("<key>") else {"zone": payload})(manifest)
        return f"{parent}[{json.dumps(payload)}]" if field.endswith("<key>") else f"{parent}.zone"
    put(field, payload)(manifest)
    return field


def _leaves(node: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{path}.{key}")]
    if isinstance(node, list):
        return [leaf for index, value in enumerate(node) for leaf in _leaves(value, f"{path}[{index}]")]
    return [(path, node)]


def assert_inert(rayjob: dict[str, Any], payload: str) -> None:
    """The payload is data: in env values and volume sources only, never in anything run."""
    assert rayjob["spec"]["entrypoint"] == ENTRYPOINT
    assert shlex.split(rayjob["spec"]["entrypoint"]) == ["python", "-m", "rocmtrain_train"]
    assert rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
    leaves = _leaves(rayjob)
    assert not [path for path, _ in leaves if path.endswith((".command", ".args")) or ".command[" in path]
    for path, value in leaves:
        if isinstance(value, str) and payload in value:
            assert path.endswith(".value") or ".volumes[" in path, path
    assert yaml.safe_load(render_rayjob_yaml_of(rayjob)) == rayjob


def render_rayjob_yaml_of(rayjob: dict[str, Any]) -> str:
    return yaml.safe_dump(rayjob, sort_keys=True)


def test_every_string_field_is_covered() -> None:
    assert len(STRING_FIELDS) >= 35
    for field in ("spec.model.source", "spec.env[0].value", "spec.env[2].valueFrom.secretKeyRef.key", "spec.image"):
        assert field in STRING_FIELDS


@pytest.mark.parametrize("field", STRING_FIELDS)
def test_shell_metacharacters_in_every_string_field(field: str) -> None:
    for payload in PAYLOADS:
        manifest = _all_strings_job()
        blamed = _inject(manifest, field, payload)
        job, errors = validate_job(manifest)
        if job is None:
            assert blamed in [e.path for e in errors], (payload, errors)
            assert all(payload not in e.path or e.path == blamed for e in errors)
        else:
            assert_inert(render_rayjob(job), payload)


def test_env_value_stays_verbatim_data() -> None:
    manifest = full_job()
    manifest["spec"]["env"][0]["value"] = "$(rm -rf /); `reboot`\nexit 1"
    job, errors = validate_job(manifest)
    assert errors == []
    assert job is not None
    rayjob = render_rayjob(job)
    assert_inert(rayjob, manifest["spec"]["env"][0]["value"])
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    worker = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    for container in (head, worker):
        assert {"name": "HF_HUB_OFFLINE", "value": "$(rm -rf /); `reboot`\nexit 1"} in container["env"]
    (config,) = [var["value"] for var in head["env"] if var["name"] == "ROCMTRAIN_JOB"]
    assert json.loads(config)["spec"]["env"][0]["value"] == "$(rm -rf /); `reboot`\nexit 1"
    assert yaml.safe_load(render_rayjob_yaml(job)) == rayjob


def test_volume_source_strings_stay_inside_the_volume() -> None:
    manifest = full_job()
    manifest["spec"]["volumes"][1] = {
        "name": "ckpt",
        "csi": {"driver": "s3.csi.aws.com", "volumeAttributes": {"mountOptions": "$(reboot); `id`"}},
    }
    manifest["spec"]["checkpoint"]["storagePath"] = "s3://checkpoints/sample"  # no checkpoints on a csi volume
    job, errors = validate_job(manifest)
    assert errors == []
    assert job is not None
    rayjob = render_rayjob(job)
    assert_inert(rayjob, "$(reboot); `id`")


# --- pydantic and CEL agree ---------------------------------------------------------------


def _cel_rules(node: dict[str, Any], path: str = "") -> list[tuple[str, str]]:
    """(schema path, rule) of every CEL rule that judges one object (transition rules excluded)."""
    found = [(path, r["rule"]) for r in node.get("x-kubernetes-validations", []) if "oldSelf" not in r["rule"]]
    for name, sub in node.get("properties", {}).items():
        found += _cel_rules(sub, f"{path}.{name}" if path else name)
    if "items" in node:
        found += _cel_rules(node["items"], f"{path}[]")
    return found


TRAVERSAL = "!self.matches('(^|/)[.][.](/|$)')"
LABEL_KEYS = next(rule for path, rule in _cel_rules(crd.openapi_schema()) if path == "spec.scheduling.nodeSelector")
SEARCH_SPACE_RULE = next(rule for path, rule in _cel_rules(crd.openapi_schema()) if path == "spec.tuning.searchSpace")
VOLUME_RULE = next(rule for path, rule in _cel_rules(crd.openapi_schema()) if path == "spec.volumes[]")
# (schema path, rule) -> (edit of full_job(), path pydantic blames)
CEL_CASES: dict[tuple[str, str], tuple[Edit, str]] = {
    ("", "size(self.metadata.name) <= 40"): (put("metadata.name", LONG_NAME), "metadata.name"),
    ("", "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"): (put("metadata.name", "9a"), "metadata.name"),
    ("spec", "self.volumeMounts.all(m, self.volumes.exists(v, v.name == m.name))"): (
        put("spec.volumeMounts[0].name", "gone"),
        "spec.volumeMounts",
    ),
    ("spec", "!has(self.scheduling.queueName) || self.lifecycle.shutdownAfterJobFinishes"): (
        both(put("spec.scheduling.queueName", "q"), put("spec.lifecycle", {"shutdownAfterJobFinishes": False})),
        "spec.lifecycle.shutdownAfterJobFinishes",
    ),
    ("spec", "!self.suspend || self.lifecycle.shutdownAfterJobFinishes"): (
        both(put("spec.suspend", True), put("spec.lifecycle", {"shutdownAfterJobFinishes": False})),
        "spec.suspend",
    ),
    (
        "spec.resources.gpu",
        "!has(self.resourceName) || !has(self.partition) || self.resourceName == 'amd.com/' + self.partition",
    ): (
        put("spec.resources.gpu", {"partition": "cpx_nps4", "resourceName": "amd.com/spx_nps1"}),
        "spec.resources.gpu.resourceName",
    ),
    ("spec.scheduling", "!has(self.topology) || has(self.queueName)"): (
        put("spec.scheduling.topology", {"level": "cloud.provider.com/topology-rack"}),
        "spec.scheduling.topology",
    ),
    ("spec", "!self.suspend || !has(self.scheduling.queueName)"): (
        both(put("spec.suspend", True), put("spec.scheduling.queueName", "q")),
        "spec.suspend",
    ),
    ("spec.model", "self.task != 'sequence-classification' || has(self.numLabels)"): (
        drop("spec.model.numLabels"),
        "spec.model.numLabels",
    ),
    ("spec.model", "self.task != 'regression' || !has(self.numLabels) || self.numLabels == 1"): (
        put("spec.model.task", "regression"),
        "spec.model.numLabels",
    ),
    ("spec.model.source", TRAVERSAL): (put("spec.model.source", "/m/../x"), "spec.model.source"),
    ("spec.data.train.uri", TRAVERSAL): (put("spec.data.train.uri", "/d/../x"), "spec.data.train.uri"),
    ("spec.data.eval.uri", TRAVERSAL): (put("spec.data.eval.uri", "s3://b/.."), "spec.data.eval.uri"),
    ("spec.volumeMounts[].mountPath", TRAVERSAL): (
        put("spec.volumeMounts[1].mountPath", "/a/../b"),
        "spec.volumeMounts[1].mountPath",
    ),
    ("spec.volumeMounts[].subPath", TRAVERSAL): (
        put("spec.volumeMounts[1].subPath", "a/../../b"),
        "spec.volumeMounts[1].subPath",
    ),
    ("spec.checkpoint.storagePath", TRAVERSAL): (
        put("spec.checkpoint.storagePath", "/checkpoints/../etc"),
        "spec.checkpoint.storagePath",
    ),
    ("spec.resources", "self.gpusPerWorker > 0 || !has(self.gpu)"): (
        put("spec.resources.gpusPerWorker", 0),
        "spec.resources.gpu",
    ),
    (
        "spec.resources",
        "self.workers <= 1 || self.gpusPerWorker == 0 || !has(self.network) || has(self.network.rdmaResource) "
        "|| !has(self.network.gidIndex) && (!has(self.network.ibHca) || size(self.network.ibHca) == 0)",
    ): (put("spec.resources.network", {"gidIndex": 3}), "spec.resources.network.rdmaResource"),
    ("spec.scheduling.tolerations[].key", "self.matches(r'^([^/]{1,253}/)?[^/]*$')"): (
        put("spec.scheduling.tolerations", [{"key": LONG_PREFIX_KEY, "operator": "Exists"}]),
        "spec.scheduling.tolerations[0].key",
    ),
    ("spec.scheduling.topology.level", "self.matches(r'^([^/]{1,253}/)?[^/]*$')"): (
        both(put("spec.scheduling.queueName", "q"), put("spec.scheduling.topology", {"level": LONG_PREFIX_KEY})),
        "spec.scheduling.topology.level",
    ),
    ("spec.scheduling.nodeSelector", LABEL_KEYS): (
        put("spec.scheduling.nodeSelector", {"-bad": "v"}),
        'spec.scheduling.nodeSelector["-bad"]',
    ),
    ("spec.env[]", "!(has(self.value) && has(self.valueFrom))"): (put("spec.env[2].value", "v"), "spec.env[2]"),
    ("spec.volumes[].configMap.items[].path", TRAVERSAL): (
        put("spec.volumes[0]", {"name": "c", "configMap": {"name": "c", "items": [{"key": "k", "path": "a/../../x"}]}}),
        "spec.volumes[0].configMap.items[0].path",
    ),
    ("spec.volumes[].secret.items[].path", TRAVERSAL): (
        put("spec.volumes[0]", {"name": "s", "secret": {"secretName": "s", "items": [{"key": "k", "path": ".."}]}}),
        "spec.volumes[0].secret.items[0].path",
    ),
    ("spec.volumes[].nfs.path", TRAVERSAL): (
        put("spec.volumes[0]", {"name": "n", "nfs": {"server": "nfs", "path": "/exports/../etc"}}),
        "spec.volumes[0].nfs.path",
    ),
    ("spec.volumes[].csi.volumeAttributes", LABEL_KEYS): (
        put("spec.volumes[0]", {"name": "c", "csi": {"driver": "d", "volumeAttributes": {"-bad": "v"}}}),
        'spec.volumes[0].csi.volumeAttributes["-bad"]',
    ),
    ("spec.volumes[]", VOLUME_RULE): (put("spec.volumes[0].secret", {"secretName": "s"}), "spec.volumes[0]"),
    ("spec", "has(self.checkpoint.storagePath)"): (drop("spec.checkpoint.storagePath"), "spec.checkpoint.storagePath"),
    ("spec.tuning", "self.maxConcurrentTrials <= self.numTrials"): (
        tuning(put("spec.tuning.maxConcurrentTrials", 5)),
        "spec.tuning.maxConcurrentTrials",
    ),
    ("spec.tuning.searchSpace", SEARCH_SPACE_RULE): (tuning(put(TS, {})), TS),
    ("spec.tuning.searchSpace.learningRate", "self.min < self.max"): (
        tuning(put(f"{TS}.learningRate.min", 0.5)),
        f"{TS}.learningRate.min",
    ),
    ("spec.tuning.searchSpace.warmupRatio", "self.min < self.max"): (
        tuning(put(f"{TS}.warmupRatio.min", 0.3)),
        f"{TS}.warmupRatio.min",
    ),
    ("spec.tuning.searchSpace.weightDecay", "self.min < self.max"): (
        tuning(put(f"{TS}.weightDecay.min", 0.1)),
        f"{TS}.weightDecay.min",
    ),
    ("spec.lifecycle", "!has(self.ttlSecondsAfterFinished) || self.shutdownAfterJobFinishes"): (
        put("spec.lifecycle.shutdownAfterJobFinishes", False),
        "spec.lifecycle.ttlSecondsAfterFinished",
    ),
    (
        "spec.training",
        "!has(self.sharding) || self.sharding != 'fsdp' || !has(self.precision) || self.precision != 'fp16'",
    ): (
        both(put("spec.training.sharding", "fsdp"), put("spec.training.precision", "fp16")),
        "spec.training.precision",
    ),
    ("spec.model", "self.task != 'causal-lm' || !has(self.numLabels)"): (
        lm(put("spec.model.numLabels", 2)),
        "spec.model.numLabels",
    ),
    ("spec.model", "self.task == 'causal-lm' || !has(self.chatTemplate)"): (
        put("spec.model.chatTemplate", "{{ x }}"),
        "spec.model.chatTemplate",
    ),
    ("spec.data", "has(self.promptField) == has(self.responseField)"): (
        lm(drop("spec.data.promptField")),
        "spec.data.promptField",
    ),
    ("spec.data", "!has(self.messagesField) || !has(self.promptField)"): (
        lm(put("spec.data.messagesField", "messages")),
        "spec.data.messagesField",
    ),
    ("spec.data", "!has(self.chatTemplateArgs) || has(self.messagesField)"): (put(ARGS, {"x": "1"}), ARGS),
    ("spec.data", RESERVED_RULE): (chat_lm(put(ARGS, {"messages": "x"})), ARGS),
    (ARGS, f"self.all(k, k.matches(r'{TEMPLATE_VARIABLE}'))"): (chat_lm(put(ARGS, {"9x": "1"})), f'{ARGS}["9x"]'),
    ("spec.adapter.targetModules", "!self.exists(m, m == 'all-linear') || self.size() == 1"): (
        lm(put("spec.adapter", {"targetModules": ["all-linear", "q_proj"]})),
        "spec.adapter.targetModules",
    ),
    **{
        ("spec", f"!has(self.model) || !has(self.data) || ({rule})"): (edit, path)
        for rule, edit, path in (
            (
                "self.model.task == 'causal-lm' || !(has(self.data.promptField) || has(self.data.messagesField))",
                put("spec.data.messagesField", "m"),
                "spec.data",
            ),
            (
                "self.model.task == 'causal-lm' || (!has(self.training.lossOn) && !self.training.packing "
                "&& !has(self.training.tokensPerWorker) && !has(self.training.lossImplementation) "
                "&& self.training.attentionImplementation != 'varlen')",
                put("spec.training.lossOn", "all"),
                "spec.training",
            ),
            (
                "!has(self.training.tokensPerWorker) || self.training.tokensPerWorker >= self.model.maxSeqLength",
                lm(put("spec.training.tokensPerWorker", 64)),
                "spec.training.tokensPerWorker",
            ),
            ("self.model.task == 'causal-lm' || !has(self.adapter)", put("spec.adapter", {}), "spec.adapter"),
            (
                "self.model.task == 'causal-lm' || !has(self.data.truncation) || self.data.truncation == 'cut'",
                put("spec.data.truncation", "drop"),
                "spec.data.truncation",
            ),
            (
                "self.model.task != 'causal-lm' || !has(self.data.textPairField)",
                lm(put("spec.data.textPairField", "b")),
                "spec.data.textPairField",
            ),
            (
                "!has(self.training.lossOn) || self.training.lossOn == 'all' || has(self.data.promptField) "
                "|| has(self.data.messagesField)",
                lm(
                    drop("spec.data.promptField"),
                    drop("spec.data.responseField"),
                    put("spec.training.lossOn", "response"),
                ),
                "spec.training.lossOn",
            ),
            (
                "!has(self.evaluation.generate) || (self.model.task == 'causal-lm' && has(self.data.eval) "
                "&& (has(self.data.promptField) || has(self.data.messagesField)))",
                put("spec.evaluation.generate", {}),
                "spec.evaluation.generate",
            ),
        )
    },
    ("spec", "!has(self.tuning) || !has(self.tuning.searchSpace.adapterRank) || has(self.adapter)"): (
        both(lm(), tuning(put(f"{TS}.adapterRank", [4]))),
        f"{TS}.adapterRank",
    ),
    ("spec", "has(self.code) || has(self.model)"): (drop("spec.model"), "spec.model"),
    ("spec", "has(self.code) || has(self.data)"): (drop("spec.data"), "spec.data"),
    ("spec", "!has(self.code) || !has(self.tuning)"): (both(CODE, tuning()), "spec.tuning"),
    ("spec", "!has(self.code) || self.checkpoint.everySteps == 0"): (
        both(CODE, put("spec.checkpoint.everySteps", 100)),
        "spec.checkpoint.everySteps",
    ),
    ("spec", "!has(self.code) || self.checkpoint.resume == 'auto'"): (
        both(CODE, put("spec.checkpoint.resume", "never")),
        "spec.checkpoint.resume",
    ),
    ("spec", "!has(self.code) || !has(self.adapter)"): (both(CODE, lm(put("spec.adapter", {}))), "spec.adapter"),
    ("spec", "!has(self.code) || (!self.training.packing && !has(self.training.tokensPerWorker))"): (
        both(CODE, lm(put("spec.training.packing", True))),
        "spec.training.packing",
    ),
    ("spec", "!has(self.code) || !has(self.training.lossImplementation)"): (
        both(CODE, lm(put("spec.training.lossImplementation", "chunked"))),
        "spec.training.lossImplementation",
    ),
    (
        "spec.training",
        "!self.packing || !has(self.attentionImplementation) || self.attentionImplementation != 'varlen'",
    ): (
        lm(put(ATTENTION, "varlen"), put("spec.training.packing", True)),
        "spec.training.packing",
    ),
    ("spec", "!has(self.code) || !has(self.training.lossOn)"): (
        both(CODE, lm(put("spec.training.lossOn", "all"))),
        "spec.training.lossOn",
    ),
    ("spec", "!has(self.code) || !has(self.evaluation.generate)"): (
        both(CODE, lm(put("spec.evaluation.generate", {}))),
        "spec.evaluation.generate",
    ),
    ("spec", "!has(self.code) || self.training.sharding != 'fsdp'"): (
        both(CODE, put("spec.training.sharding", "fsdp")),
        "spec.training.sharding",
    ),
    ("spec.code.workingDir", TRAVERSAL): (
        put("spec.code", {"command": ["python"], "workingDir": "/code/../etc"}),
        "spec.code.workingDir",
    ),
    ("spec.code", "has(self.command) != has(self.module)"): (
        put("spec.code", {"command": ["python"], "module": "team.train"}),
        "spec.code",
    ),
    ("spec.code", "!has(self.args) || has(self.module)"): (
        put("spec.code", {"command": ["python"], "args": ["--epochs", "3"]}),
        "spec.code.args",
    ),
    ("spec.code", "!has(self.command) || size(self.command[0]) > 0"): (
        put("spec.code", {"command": ["", "train.py"]}),
        "spec.code.command",
    ),
    ("spec.code", "!has(self.command) || size(self.command.join(' ')) <= 16384"): (
        put("spec.code", {"command": ["python", *[LONGEST_ARGUMENT] * 4]}),
        "spec.code.command",
    ),
    ("spec.code", "!has(self.args) || size(self.args.join(' ')) <= 16384"): (
        put("spec.code", {"module": "team.train", "args": [LONGEST_ARGUMENT] * 5}),
        "spec.code.args",
    ),
}


def test_every_cel_rule_has_a_case() -> None:
    assert sorted(_cel_rules(crd.openapi_schema())) == sorted(CEL_CASES)


@pytest.mark.parametrize("rule", CEL_CASES, ids=[f"{path}:{rule[:40]}" for path, rule in CEL_CASES])
def test_pydantic_refuses_what_cel_refuses(rule: tuple[str, str]) -> None:
    edit, path = CEL_CASES[rule]
    manifest = full_job()
    edit(manifest)
    job, errors = validate_job(manifest)
    assert job is None
    assert path in [e.path for e in errors], errors


# ---- checkpoints only where every pod sees the same bytes -----------------------------------------------

STORAGE_SOURCES: dict[str, dict[str, Any]] = {
    "persistentVolumeClaim": {"claimName": "checkpoints"},
    "nfs": {"server": "nfs.storage.local", "path": "/exports/ckpt"},
    "emptyDir": {},
    "ephemeral": {
        "volumeClaimTemplate": {
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "100Gi"}}}
        }
    },
    "csi": {"driver": "s3.csi.aws.com"},
    "secret": {"secretName": "keys"},
    "configMap": {"name": "settings"},
}


def _storage_on(source: str, body: dict[str, Any], *, mount: dict[str, Any] | None = None) -> dict[str, Any]:
    manifest = full_job()
    put("spec.volumes[1]", {"name": "ckpt", source: body})(manifest)
    put("spec.volumeMounts[1]", {"name": "ckpt", "mountPath": "/checkpoints", **(mount or {})})(manifest)
    return manifest


@pytest.mark.parametrize(
    ("source", "shared"),
    [
        ("persistentVolumeClaim", True),
        ("nfs", True),
        ("emptyDir", False),
        ("ephemeral", False),
        ("csi", False),
        ("secret", False),
        ("configMap", False),
    ],
)
def test_checkpoints_lie_only_on_volumes_every_pod_shares_and_that_outlive_them(source: str, shared: bool) -> None:
    job, errors = validate_job(_storage_on(source, STORAGE_SOURCES[source]))
    if shared:
        assert job is not None, errors
        return
    (error,) = errors
    assert error.path == "spec.checkpoint.storagePath"
    assert f"/checkpoints/sample lies on volume ckpt ({source}): " in error.message
    assert "s3://bucket/path" in error.message and "persistentVolumeClaim" in error.message
    assert validate_job(_storage_on(source, STORAGE_SOURCES[source]), context="local")[1] == [], "no pods locally"


def test_every_volume_kind_has_a_checkpoint_rule() -> None:
    assert sorted(VOLUME_SOURCES) == sorted([*SHARED_VOLUMES, *UNSHARED_VOLUMES]) == sorted(STORAGE_SOURCES)


@pytest.mark.parametrize(
    ("source", "body", "mount"),
    [
        ("persistentVolumeClaim", {"claimName": "checkpoints", "readOnly": True}, {}),
        ("nfs", {**STORAGE_SOURCES["nfs"], "readOnly": True}, {}),
        ("persistentVolumeClaim", {"claimName": "checkpoints"}, {"readOnly": True}),
    ],
)
def test_a_read_only_claim_or_export_holds_no_checkpoints(
    source: str, body: dict[str, Any], mount: dict[str, Any]
) -> None:
    (error,) = validate_job(_storage_on(source, body, mount=mount))[1]
    assert "/checkpoints/sample lies on volume ckpt, mounted read-only" in error.message


def test_the_deepest_mount_holding_the_path_is_the_one_it_lies_on() -> None:
    """A mount inside another hides what lies below it: an emptyDir inside a claim is still an emptyDir."""
    manifest = full_job()
    manifest["spec"]["volumes"].append({"name": "scratch", "emptyDir": {}})
    manifest["spec"]["volumeMounts"].append({"name": "scratch", "mountPath": "/checkpoints//sample/"})
    (error,) = validate_job(manifest)[1]
    assert "lies on volume scratch (emptyDir)" in error.message
    put("spec.checkpoint.storagePath", "/checkpoints/other")(manifest)
    assert validate_job(manifest)[1] == []


@pytest.mark.parametrize("uri", ["s3:///", "s3://", "s3:///ckpt", "gs:///b", "abfs:///p", "s3://-bucket/x"])
@pytest.mark.parametrize("field", ["spec.checkpoint.storagePath", "spec.data.train.uri", "spec.model.source"])
def test_an_object_store_uri_names_its_bucket(field: str, uri: str) -> None:
    manifest = full_job()
    put(field, uri)(manifest)
    (error,) = validate_job(manifest)[1]
    assert error.path == field and "names its bucket or container (s3://bucket/path" in error.message


def test_object_store_uris_with_their_bucket_are_accepted() -> None:
    for uri in ("s3://ckpt", "s3://ckpt/runs", "gs://b/x", "gcs://b", "abfs://runs@acct.dfs.core.windows.net/x"):
        manifest = full_job()
        put("spec.checkpoint.storagePath", uri)(manifest)
        assert validate_job(manifest)[1] == [], uri
