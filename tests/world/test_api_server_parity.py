"""The models, the generated CRD and KubeRay's CRD agree, as judged by a real kube-apiserver.

Pydantic validates in the CLI, the operator and the training image; the API server
validates with the generated schema and CEL. These tests show both accept the same
objects, reject the same objects with the same message, and default the same way, and
that every rendered RayJob passes a server-side dry-run create against KubeRay's CRD.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.api.validate import validate_job
from rocmtrain.render import render_rayjob
from rocmtrain_testworld.kubecluster import KubeCluster
from unit.edits import both, drop, put
from unit.samples import example, full_job, language_model_job, minimal_job

pytestmark = pytest.mark.cluster

Edit = Callable[[dict[str, Any]], None]
CODE = put("spec.code", {"command": ["python", "/code/train.py"]})
# language_model_job() running its own code, without the fields only the built-in loop reads.
CODE_LM = both(CODE, drop("spec.adapter"), drop("spec.training"), drop("spec.evaluation"))


def _in(namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    manifest = copy.deepcopy(manifest)
    manifest["metadata"] = {"name": manifest["metadata"]["name"], "namespace": namespace}
    return manifest


@pytest.fixture(scope="module")
def namespace(kube: KubeCluster) -> str:
    return kube.new_namespace("parity")


@pytest.mark.parametrize(
    "name", ["cluster-mi300x", "cluster-llama-lora-mi300x", "cluster-llama-70b-lora-fsdp-mi300x", "kueue"]
)
def test_rendered_examples_pass_kuberay_dry_run(kube: KubeCluster, namespace: str, name: str) -> None:
    job, errors = validate_job(_in(namespace, example(f"{name}.yaml")))
    assert job is not None, errors
    kube.create(render_rayjob(job), dry_run=True)


def test_rendered_full_job_passes_kuberay_dry_run(kube: KubeCluster, namespace: str) -> None:
    job, errors = validate_job(_in(namespace, full_job()))
    assert job is not None, errors
    kube.create(render_rayjob(job), dry_run=True)


@pytest.mark.parametrize("sample", [minimal_job, language_model_job])
def test_server_defaults_equal_model_defaults(kube: KubeCluster, namespace: str, sample: Callable) -> None:
    manifest = _in(namespace, sample())
    stored = kube.create(manifest, dry_run=True)
    assert stored["spec"] == RocmTrainingJob.model_validate(manifest).spec.dump()


def test_a_language_model_job_is_accepted_by_both_and_renders(kube: KubeCluster, namespace: str) -> None:
    job, errors = validate_job(_in(namespace, language_model_job()))
    assert job is not None, errors
    kube.create(job.model_dump(by_alias=True, exclude_none=True, mode="json"), dry_run=True)
    kube.create(render_rayjob(job), dry_run=True)


def test_chat_template_args_are_stored_as_given(kube: KubeCluster, namespace: str) -> None:
    manifest = _in(namespace, language_model_job())
    args = {"enable_thinking": "false", "days": "3", "persona": "a terse tutor"}
    put(ARGS, args)(manifest)
    job, errors = validate_job(manifest)
    assert job is not None, errors
    assert (
        kube.create(manifest, dry_run=True)["spec"]["data"]["chatTemplateArgs"]
        == args
        == job.spec.data.dump()["chatTemplateArgs"]
    )


def test_full_job_is_accepted_by_both(kube: KubeCluster, namespace: str) -> None:
    manifest = _in(namespace, full_job())
    assert validate_job(manifest)[0] is not None
    kube.create(manifest, dry_run=True)


# Each case breaks one rule; the API server (schema or CEL) and pydantic must both refuse it.
REFUSED: list[tuple[str, Edit, str]] = [
    ("labels-missing", drop("spec.model.numLabels"), "numLabels is required"),
    ("regression-labels", put("spec.model", {"source": "/m", "task": "regression", "numLabels": 3}), "numLabels"),
    (
        "gpu-model-without-gpus",
        put("spec.resources", {"gpusPerWorker": 0, "gpu": {"family": "AI"}}),
        "gpu model selection requires gpusPerWorker > 0",
    ),
    (
        "env-two-sources",
        put("spec.env", [{"name": "X", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
        "set either value or valueFrom, not both",
    ),
    (
        "volume-two-sources",
        put("spec.volumes", [{"name": "v", "emptyDir": {}, "persistentVolumeClaim": {"claimName": "c"}}]),
        "exactly one source",
    ),
    ("volume-no-source", put("spec.volumes", [{"name": "v"}]), "exactly one source"),
    (
        "ttl-without-shutdown",
        put("spec.lifecycle", {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 60}),
        "ttlSecondsAfterFinished requires shutdownAfterJobFinishes",
    ),
    (
        "mount-without-volume",
        put("spec.volumeMounts", [{"name": "nope", "mountPath": "/nope"}]),
        "every volumeMount must name a volume",
    ),
    ("path-traversal", put("spec.data.train.uri", "/data/../etc/passwd"), "'..'"),
    ("name-too-long", put("metadata.name", "j" * 41), "at most 40"),
    ("workers-zero", put("spec.resources.workers", 0), "workers"),
    ("gpus-fractional", put("spec.resources.gpusPerWorker", 0.5), "gpusPerWorker"),
    ("precision-unknown", put("spec.training.precision", "fp8"), "precision"),
    ("shell-in-image", put("spec.image", "busybox; rm -rf /"), "image"),
    ("newline-in-field", put("spec.data.textField", "text\nlabel"), "textField"),
    ("node-selector-key", put("spec.scheduling.nodeSelector", {"bad key!": "x"}), "label"),
    ("node-selector-key-prefix", put("spec.scheduling.nodeSelector", {f"{'a' * 254}/zone": "x"}), "253"),
    (
        "toleration-key-prefix",
        put("spec.scheduling.tolerations", [{"key": f"{'a' * 254}/g", "operator": "Exists"}]),
        "253",
    ),
    (
        "suspend-queued",
        both(put("spec.suspend", True), put("spec.scheduling.queueName", "team-a")),
        "Kueue owns its RayJob's suspend",
    ),
    ("queue-over-label", put("spec.scheduling.queueName", "q" * 64), "63"),
    (
        "volume-items",
        put("spec.volumes", [{"name": "c", "configMap": {"name": "c", "items": [{"key": "k", "path": "p"}] * 65}}]),
        "at most 64 items",
    ),
    ("volume-nfs-path", put("spec.volumes", [{"name": "n", "nfs": {"server": "nfs", "path": "x;y"}}]), "nfs.path"),
    ("storage-missing", drop("spec.checkpoint.storagePath"), "checkpoint.storagePath is required for a cluster job"),
    ("storage-no-bucket", put("spec.checkpoint.storagePath", "s3:///ckpt"), "spec.checkpoint.storagePath"),
    (
        "tuning-concurrency",
        put("spec.tuning", {"searchSpace": {"epochs": [1, 2]}, "numTrials": 2, "maxConcurrentTrials": 3}),
        "maxConcurrentTrials must not exceed numTrials",
    ),
    (
        "tuning-range-reversed",
        put("spec.tuning", {"searchSpace": {"weightDecay": {"min": 0.2, "max": 0.1}}}),
        "min must be less than max",
    ),
    ("tuning-space-empty", put("spec.tuning", {"searchSpace": {}}), "at least one hyper-parameter"),
    ("tuning-metric", put("spec.tuning", {"searchSpace": {"epochs": [1]}, "metric": "bleu"}), "metric"),
    (
        "lm-fields-on-classifier",
        both(put("spec.data.promptField", "p"), put("spec.data.responseField", "r")),
        "for task causal-lm",
    ),
    ("lm-adapter-on-classifier", put("spec.adapter", {}), "adapter (LoRA) is for task causal-lm"),
    ("lm-packing-on-classifier", put("spec.training.packing", True), "varlen are for task causal-lm"),
    ("lm-drop-on-classifier", put("spec.data.truncation", "drop"), "truncation: drop is for task causal-lm"),
    # A job's own code (spec.code): model and data optional with it only, loop-only fields refused with it.
    ("model-missing", drop("spec.model"), "model is required unless code runs your own training code"),
    ("data-missing", drop("spec.data"), "data is required unless code runs your own training code"),
    ("code-with-tuning", both(CODE, put("spec.tuning", {"searchSpace": {"epochs": [1]}})), "runs the built-in loop"),
    (
        "code-every-steps",
        both(CODE, put("spec.checkpoint.everySteps", 10)),
        "checkpoint.everySteps is the built-in loop's",
    ),
    ("code-resume-never", both(CODE, put("spec.checkpoint.resume", "never")), "checkpoint.resume: never is"),
    ("code-command-and-module", put("spec.code", {"command": ["python"], "module": "a"}), "exactly one of command"),
    ("code-neither", put("spec.code", {"workingDir": "/code"}), "exactly one of command or module"),
    ("code-args-with-command", put("spec.code", {"command": ["python"], "args": ["x"]}), "args go with module"),
    ("code-empty-program", put("spec.code", {"command": ["", "x"]}), "must not be empty"),
    ("code-ten-thousand-arguments", put("spec.code", {"command": ["x"] * 10_000}), "256"),
    ("code-too-long", put("spec.code", {"command": ["python", *["x" * 4096] * 4]}), "16384 characters in all"),
    ("code-argument-too-long", put("spec.code", {"command": ["python", "x" * 4097]}), "command[1]"),
    ("code-nul", put("spec.code", {"command": ["python", "a\x00b"]}), "command[1]"),
    ("code-module-not-a-module", put("spec.code", {"module": "team.train; rm -rf /"}), "module"),
    ("code-dir-traversal", put("spec.code", {"module": "t", "workingDir": "/code/../etc"}), "'..'"),
    ("code-lm-fields", both(CODE, put("spec.data.messagesField", "m")), "for task causal-lm"),
    ("code-fsdp", both(CODE, put("spec.training.sharding", "fsdp")), "your code chooses its own strategy"),
]
ARGS = "spec.data.chatTemplateArgs"
PAIRS = {"train": {"uri": "/d/train.jsonl"}, "eval": {"uri": "/d/eval.jsonl"}, "promptField": "p", "responseField": "r"}
# The same for a causal-lm job (language_model_job()).
REFUSED_LANGUAGE_MODEL: list[tuple[str, Edit, str]] = [
    ("lm-labels", put("spec.model.numLabels", 2), "a causal-lm job predicts tokens"),
    (
        "lm-fsdp-fp16",
        put("spec.training", {"sharding": "fsdp", "precision": "fp16"}),
        "fp16 would need a sharded gradient scaler",
    ),
    ("lm-two-shapes", both(put("spec.data.promptField", "p"), put("spec.data.responseField", "r")), "not both"),
    ("lm-budget-small", put("spec.training.tokensPerWorker", 64), "at least model.maxSeqLength"),
    (
        "lm-varlen-packing",
        put("spec.training", {"packing": True, "attentionImplementation": "varlen"}),
        "two layouts",
    ),
    ("lm-prompt-alone", both(drop("spec.data.messagesField"), put("spec.data.promptField", "p")), "go together"),
    (
        "lm-response-loss-on-text",
        both(drop("spec.data.messagesField"), drop("spec.evaluation")),
        "plain-text records have none",
    ),
    ("lm-generate-without-eval", drop("spec.data.eval"), "needs held-out prompts"),
    ("lm-all-linear-and-names", put("spec.adapter.targetModules", ["all-linear", "q_proj"]), "stands alone"),
    ("lm-module-name", put("spec.adapter.targetModules", ["q_proj;x"]), "targetModules"),
    ("lm-template-size", put("spec.model.chatTemplate", "x" * 16_385), "chatTemplate"),
    ("lm-template-args-on-pairs", put("spec.data", {**PAIRS, "chatTemplateArgs": {"x": "1"}}), "for chat records"),
    ("lm-template-args-reserved", put(ARGS, {"tokenize": "true"}), "apply_chat_template sets itself"),
    ("lm-template-args-key", put(ARGS, {"enable-thinking": "false"}), "template variable name"),
    ("lm-template-args-unquoted", put(ARGS, {"enable_thinking": False}), "enable_thinking"),
    ("lm-template-args-long", put(ARGS, {"name": "x" * 1025}), "1024"),
    ("lm-template-args-many", put(ARGS, {f"k{i}": "1" for i in range(17)}), "16"),
    ("lm-rank", put("spec.adapter.rank", 0), "rank"),
    (
        "lm-rank-search",
        both(drop("spec.adapter"), put("spec.tuning", {"searchSpace": {"adapterRank": [4]}})),
        "needs spec.adapter",
    ),
    # With code, each of the built-in loop's language-model fields alone (CODE_LM keeps none of them).
    ("code-adapter", both(CODE_LM, put("spec.adapter", {})), "adapter is the built-in loop's"),
    ("code-packing", both(CODE_LM, put("spec.training.packing", True)), "packing and tokensPerWorker are the built"),
    ("code-loss-on", both(CODE_LM, put("spec.training.lossOn", "all")), "training.lossOn is the built-in loop's"),
    ("code-generate", both(CODE_LM, put("spec.evaluation.generate", {})), "evaluation.generate is the built-in"),
]


# One volume of every source the API offers, with every field set.
EVERY_SOURCE = [
    {"name": "claim", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
    {
        "name": "config",
        "configMap": {
            "name": "c",
            "items": [{"key": "a.yaml", "path": "conf/a.yaml", "mode": 0o440}],
            "optional": True,
        },
    },
    {"name": "creds", "secret": {"secretName": "s", "defaultMode": 0o400}},
    {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
    {"name": "share", "nfs": {"server": "10.0.0.2", "path": "/exports/data", "readOnly": True}},
    {
        "name": "bucket",
        "csi": {
            "driver": "s3.csi.aws.com",
            "readOnly": False,
            "fsType": "fuse",
            "volumeAttributes": {"bucketName": "b", "mountOptions": "allow-delete,region us-east-1"},
            "nodePublishSecretRef": {"name": "s3-creds"},
        },
    },
    {
        "name": "local",
        "ephemeral": {
            "volumeClaimTemplate": {
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "fast",
                    "volumeMode": "Filesystem",
                    "resources": {"requests": {"storage": "100Gi"}},
                }
            }
        },
    },
]


def test_every_volume_source_is_stored_as_given(kube: KubeCluster, namespace: str) -> None:
    manifest = _in(namespace, minimal_job())
    manifest["spec"]["volumes"] = EVERY_SOURCE
    job = RocmTrainingJob.model_validate(manifest)
    assert [volume.dump() for volume in job.spec.volumes] == EVERY_SOURCE
    assert kube.create(manifest, dry_run=True)["spec"]["volumes"] == EVERY_SOURCE


def test_the_server_prunes_what_the_models_refuse_in_a_volume_source(kube: KubeCluster, namespace: str) -> None:
    """A source's unknown fields, however many and however deep, never reach the stored object (or the operator's
    cache): the schema has no free-form field left to keep them."""
    manifest = _in(namespace, minimal_job())
    manifest["spec"]["volumes"] = [
        {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi", **{f"k{i}": {"deep": [i]} for i in range(10_000)}}}
    ]
    assert validate_job(manifest)[0] is None
    stored = kube.create(manifest, dry_run=True)
    assert stored["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}]


def test_a_job_running_its_own_code_is_stored_as_the_models_read_it_and_renders_for_kuberay(
    kube: KubeCluster, namespace: str
) -> None:
    manifest = _in(namespace, minimal_job())
    del manifest["spec"]["model"], manifest["spec"]["data"]
    hostile = ["it's", "$(touch /tmp/x)", "a\nb", "`id`", ""]
    manifest["spec"]["code"] = {"module": "team.train", "args": hostile, "workingDir": "/code"}
    stored = kube.create(manifest, dry_run=True)
    job, errors = validate_job(manifest)
    assert job is not None, errors
    assert stored["spec"] == job.spec.dump() and stored["spec"]["code"]["args"] == hostile
    kube.create(render_rayjob(job), dry_run=True)


def test_a_job_running_its_own_code_may_pass_it_a_language_model(kube: KubeCluster, namespace: str) -> None:
    manifest = _in(namespace, language_model_job())
    CODE_LM(manifest)
    job, errors = validate_job(manifest)
    assert job is not None, errors
    assert kube.create(manifest, dry_run=True)["spec"]["model"]["task"] == "causal-lm"


def test_server_defaults_of_a_search_equal_model_defaults(kube: KubeCluster, namespace: str) -> None:
    manifest = _in(namespace, full_job())
    manifest["spec"]["tuning"] = {"searchSpace": {"learningRate": {"min": 1e-5, "max": 1e-3}}}
    stored = kube.create(manifest, dry_run=True)
    assert stored["spec"]["tuning"] == RocmTrainingJob.model_validate(manifest).spec.tuning.dump()


CASES = [(minimal_job, *case) for case in REFUSED] + [(language_model_job, *case) for case in REFUSED_LANGUAGE_MODEL]


@pytest.mark.parametrize(("sample", "case", "edit", "words"), CASES, ids=[c[1] for c in CASES])
def test_both_refuse(kube: KubeCluster, namespace: str, sample: Callable, case: str, edit: Edit, words: str) -> None:
    manifest = sample()
    edit(manifest)
    manifest["metadata"]["namespace"] = namespace

    job, errors = validate_job(manifest)
    assert job is None, case
    assert any(words in f"{e.path} {e.message}" for e in errors), errors

    with pytest.raises(ApiException) as info:
        kube.create(manifest, dry_run=True)
    assert info.value.status == 422, info.value.body
    assert words in json.loads(info.value.body)["message"], info.value.body


def test_only_suspend_and_lifecycle_change_after_creation(kube: KubeCluster, namespace: str) -> None:
    manifest = _in(namespace, full_job())
    manifest["metadata"]["name"] = "immutable"
    created = kube.create(manifest)
    path = kube.path_for(created)

    changed = kube.request(
        "PATCH",
        path,
        body={"spec": {"suspend": True, "lifecycle": {"ttlSecondsAfterFinished": 60}}},
        content_type="application/merge-patch+json",
    )
    assert changed["spec"]["suspend"] is True

    for patch in (
        {"spec": {"resources": {"workers": 9}}},
        {"spec": {"model": {"maxSeqLength": 64}}},
        {"spec": {"tuning": {"searchSpace": {"epochs": [1, 2]}}}},
    ):
        with pytest.raises(ApiException) as info:
            kube.request("PATCH", path, body=patch, content_type="application/merge-patch+json")
        assert info.value.status == 422
        assert "is immutable" in str(info.value.body)


def test_suspend_is_refused_on_a_kueue_job_when_it_changes_too(kube: KubeCluster, namespace: str) -> None:
    manifest = _in(namespace, minimal_job())
    manifest["metadata"]["name"] = "queued-suspend"
    manifest["spec"]["scheduling"] = {"queueName": "team-a"}
    path = kube.path_for(kube.create(manifest))
    with pytest.raises(ApiException) as info:
        kube.request("PATCH", path, body={"spec": {"suspend": True}}, content_type="application/merge-patch+json")
    assert info.value.status == 422
    assert "Kueue owns its RayJob's suspend" in str(info.value.body)
