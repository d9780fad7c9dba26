"""Phase notifications, the pure part: which change notifies whom, the body, its signature, the retry plan."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json

import pytest

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import NOTIFY_EVENTS, RocmTrainingJobSpec, RocmTrainingJobStatus
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.status import notifications
from rocmtrain.status.notifications import MAX_ATTEMPTS, MESSAGE_LIMIT, Notice, Target
from unit.samples import minimal_job

NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
JOB = {"metadata": {"namespace": "ml", "name": "bert", "uid": "u-1"}, "spec": {}}


def _status(phase: str, **conditions: tuple[str, str, str]) -> dict:
    wire = [
        {"type": kind, "status": holds, "reason": reason, "message": message, "lastTransitionTime": "t0"}
        for kind, (holds, reason, message) in conditions.items()
    ]
    return {"phase": phase, "conditions": wire}


def test_a_phase_change_into_a_notified_phase_is_one_notice_with_readys_reason():
    old = _status("Pending")
    new = _status("Running", Ready=("True", "Running", "the Ray job runs"))
    assert notifications.notices(old, new) == [Notice("Running", "Running", "the Ray job runs")]
    assert notifications.notices(new, new) == []
    assert notifications.notices(_status("Queued"), _status("Pending")) == [], "Pending is not notified"


def test_stalled_notifies_once_when_it_turns_true_and_not_on_a_failure():
    running = _status("Running", Stalled=("False", "Progressing", ""))
    stalled = _status("Running", Stalled=("True", "NoProgress", "no report for 900 s"))
    assert notifications.notices(running, stalled) == [Notice("Stalled", "NoProgress", "no report for 900 s")]
    assert notifications.notices(stalled, stalled) == []
    failed = _status("Failed", Ready=("False", "TrainingFailed", "boom"), Stalled=("True", "TrainingFailed", "boom"))
    assert [n.event for n in notifications.notices(running, failed)] == ["Failed"]


def test_a_new_best_trial_notifies_with_its_metric():
    old = {"phase": "Running", "tuning": {"bestTrialId": "t1", "metric": "eval_loss", "bestMetric": 0.5}}
    new = {"phase": "Running", "tuning": {"bestTrialId": "t2", "metric": "eval_loss", "bestMetric": 0.4}}
    assert notifications.notices(old, new) == [
        Notice("NewBestTrial", "NewBestTrial", "trial t2 is the best so far: eval_loss=0.4")
    ]
    assert notifications.notices(new, new) == []


def test_a_jobs_own_targets_replace_the_default_and_each_keeps_its_events():
    default = Target("default", frozenset({"Failed"}))
    assert notifications.targets({}, default) == [default]
    assert notifications.targets({}, None) == []
    spec = {
        "notifications": [
            {"secretRef": {"name": "hooks"}},
            {"secretRef": {"name": "slack", "urlKey": "webhook", "signingKeyKey": "key"}, "events": ["Failed"]},
        ]
    }
    first, second = notifications.targets(spec, default)
    assert (first.secret, first.url_key, first.signing_key_key, first.events) == (
        "hooks",
        "url",
        None,
        set(NOTIFY_EVENTS),
    )
    assert (second.label, second.url_key, second.signing_key_key) == ("spec.notifications[1]", "webhook", "key")
    failed = Notice("Failed", "TrainingFailed", "boom")
    assert notifications.wanted(second, [Notice("Running", "Running", ""), failed]) == [failed]


def test_the_spec_bounds_notifications_and_their_events():
    base = minimal_job()["spec"]
    one = {"secretRef": {"name": "hooks"}}
    spec = RocmTrainingJobSpec.model_validate({**base, "notifications": [one]})
    assert spec.notifications[0].events is None, "all of them"
    with pytest.raises(ValueError, match="notifications"):
        RocmTrainingJobSpec.model_validate({**base, "notifications": [one] * 5})
    with pytest.raises(ValueError, match="events"):
        RocmTrainingJobSpec.model_validate({**base, "notifications": [{**one, "events": ["Exploded"]}]})
    with pytest.raises(ValueError, match="events"):
        RocmTrainingJobSpec.model_validate({**base, "notifications": [{**one, "events": []}]})


def test_the_body_tells_identity_phase_reason_metrics_and_a_kubectl_hint_with_a_cut_message():
    status = {"phase": "Failed", "metrics": {"loss": 0.25, "step": 100, "note": "x", "ok": True}}
    body = notifications.payload(JOB, Notice("Failed", "TrainingFailed", "\x1b" + "x" * 5000), status, NOW)
    assert body["job"] == {"namespace": "ml", "name": "bert", "uid": "u-1"}
    assert (body["event"], body["phase"], body["reason"]) == ("Failed", "Failed", "TrainingFailed")
    assert body["metrics"] == {"loss": 0.25, "step": 100}
    assert body["kubectl"] == "kubectl -n ml describe rocmtrainingjob bert"
    assert len(body["message"]) == MESSAGE_LIMIT and body["message"].startswith("\\x1b") and body["message"][-1] == "…"
    assert body["text"].startswith("RocmTrainingJob ml/bert: Failed (TrainingFailed): ")
    assert body["time"] == "2026-12-05T12:00:00Z"
    assert json.loads(notifications.encode(body)) == body


def test_the_signature_is_the_hmac_sha256_of_the_exact_bytes_sent():
    data = notifications.encode({"b": 1, "a": "é"})
    assert data == b'{"a":"\\u00e9","b":1}', "compact, sorted, ASCII"
    expected = hmac.new(b"k3y", data, hashlib.sha256).hexdigest()
    assert notifications.signature(data, b"k3y") == f"sha256={expected}"
    assert notifications.signature(data, b"other") != f"sha256={expected}"


def test_every_try_of_one_notice_has_one_delivery_id_and_another_transition_another():
    notice = Notice("Running", "Running", "")
    status = _status("Running", Ready=("True", "Running", ""))
    later = {**status, "conditions": [{**status["conditions"][0], "lastTransitionTime": "t1"}]}
    assert notifications.delivery_id(JOB, notice, status) == notifications.delivery_id(JOB, notice, dict(status))
    assert notifications.delivery_id(JOB, notice, status) != notifications.delivery_id(JOB, notice, later)


@pytest.mark.parametrize(
    ("attempt", "status", "delay"),
    [
        (1, 200, None),
        (1, 302, None),
        (1, 400, None),
        (1, 404, None),
        (1, 408, 1.0),
        (1, 429, 1.0),
        (1, 500, 1.0),
        (2, None, 2.0),
        (3, 503, 4.0),
        (7, None, 60.0),
        (MAX_ATTEMPTS, None, None),
    ],
)
def test_retries_back_off_on_no_answer_5xx_408_and_429_only_up_to_a_bound(attempt, status, delay):
    assert notifications.retry_delay(attempt, status) == delay


def test_the_default_receiver_comes_from_the_environment_and_never_shows_its_url_or_key():
    assert OperatorConfig.from_env({}).notification is None
    env = {
        "ROCMTRAIN_NOTIFY_URL": "https://hooks.example/T0/secret-token",
        "ROCMTRAIN_NOTIFY_SIGNING_KEY": "s1gn",
        "ROCMTRAIN_NOTIFY_EVENTS": "Failed,Succeeded",
    }
    config = OperatorConfig.from_env(env)
    assert config.notification is not None
    assert config.notification.events == {"Failed", "Succeeded"} and config.notification.signing_key == b"s1gn"
    assert "secret-token" not in repr(config) and "s1gn" not in repr(config)
    assert OperatorConfig.from_env({"ROCMTRAIN_NOTIFY_URL": "http://h/x"}).notification.events == set(NOTIFY_EVENTS)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "env",
    [
        {"ROCMTRAIN_NOTIFY_URL": "ftp://hooks.example/secret-token"},
        {"ROCMTRAIN_NOTIFY_URL": "http://h/x", "ROCMTRAIN_NOTIFY_EVENTS": "Exploded"},
        {"ROCMTRAIN_NOTIFY_SIGNING_KEY": "s1gn"},
    ],
)
def test_the_default_receiver_refuses_bad_settings_without_quoting_the_url(env):
    with pytest.raises(ConfigError) as refused:
        OperatorConfig.from_env(env)
    assert "secret-token" not in str(refused.value)


def test_the_record_keeps_one_entry_per_receiver_its_last_notice_and_its_state():
    first, default = Target("spec.notifications[0]", frozenset(NOTIFY_EVENTS)), Target("default", frozenset())
    running, failed = Notice("Running", "Running", ""), Notice("Failed", "TrainingFailed", "boom")
    entries = notifications.recorded([], first, running, "a" * 32, "Pending", NOW)
    entries = notifications.recorded(entries, default, running, "b" * 32, "Delivered", NOW)
    entries = notifications.recorded(entries, first, failed, "c" * 32, "Pending", NOW)
    assert [(e["target"], e["event"], e["reason"], e["deliveryId"], e["state"]) for e in entries] == [
        ("default", "Running", "Running", "b" * 32, "Delivered"),
        ("spec.notifications[0]", "Failed", "TrainingFailed", "c" * 32, "Pending"),
    ]
    assert entries[0]["time"] == "2026-12-05T12:00:00Z"
    status = {"notifications": entries}
    RocmTrainingJobStatus.model_validate(status)  # as the CRD takes it


def test_pending_notices_are_rebuilt_from_the_status_for_the_receivers_the_job_still_has():
    spec = {"notifications": [{"secretRef": {"name": "hooks"}}]}
    status = {
        **_status("Failed", Ready=("False", "TrainingFailed", "boom")),
        "notifications": [
            {"target": "spec.notifications[0]", "event": "Failed", "reason": "TrainingFailed", "deliveryId": "a" * 32,
             "state": "Pending", "time": "t"},
            {"target": "spec.notifications[1]", "event": "Failed", "reason": "TrainingFailed", "deliveryId": "b" * 32,
             "state": "Pending", "time": "t"},
            {"target": "default", "event": "Running", "reason": "Running", "deliveryId": "c" * 32,
             "state": "Delivered", "time": "t"},
        ],
    }  # fmt: skip
    ((target, notice, delivery),) = notifications.pending(spec, status, None)
    assert (target.secret, notice, delivery) == ("hooks", Notice("Failed", "TrainingFailed", "boom"), "a" * 32)
    assert notifications.pending(spec, {**status, "notifications": status["notifications"][1:]}, None) == []
