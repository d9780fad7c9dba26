"""One job on one screen (`rocmtrain status`): phase, conditions, a progress bar, metrics, GPUs, events.

The Ready condition's message heads the screen, once: each condition that says the same (Ready, and a
failed job's `Failed`) reads `as above`, and an ended job's `Stalled=True`, which only repeats its failure for kstatus,
is left out. An ended job's progress is where it ended, without an ETA.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from rocmtrain.api.condition_reasons import ConditionType
from rocmtrain.api.contract import GPU_NODE_LABELS
from rocmtrain.api.models import NetworkTransport, Phase, metric_rows
from rocmtrain.api.timestamps import parse_time
from rocmtrain.status.accounting import gpu_seconds_at
from rocmtrain.status.gauges import WHOLE_GPU_KIND, gpu_kind
from rocmtrain.status.rdma import unused_rdma
from rocmtrain.views.pool import pod_gpus
from rocmtrain.views.table import table

BAR_WIDTH = 30
EVENTS_SHOWN = 10
METRICS_WIDTH = 100  # the metrics section wraps before this column


def duration(seconds: float) -> str:
    """A short human duration: 45s, 12m05s, 3h20m, 2d04h."""
    whole = int(max(seconds, 0))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def progress_bar(percent: float | None, width: int = BAR_WIDTH) -> str:
    """`[#######-------]  45%`; an empty bar when nothing is known."""
    if percent is None:
        return "[" + " " * width + "]    -"
    filled = round(width * min(max(percent, 0.0), 100.0) / 100)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {percent:3.0f}%"


def _age(moment: object, now: dt.datetime) -> str:
    parsed = parse_time(moment)
    return duration((now - parsed).total_seconds()) if parsed else "-"


def _wrapped(items: Sequence[str], width: int, indent: int) -> str:
    """`items` three spaces apart, on as many lines (indented by `indent`) as keep each within `width`."""
    lines = [""]
    for item in items:
        if lines[-1] and indent + len(lines[-1]) + 3 + len(item) > width:
            lines.append("")
        lines[-1] += f"   {item}" if lines[-1] else item
    return ("\n" + " " * indent).join(lines)


def _progress_line(status: Mapping[str, Any], ended: bool) -> str:
    progress = status.get("progress") or {}
    parts = [progress_bar(progress.get("percent"))]
    if progress.get("step") is not None:
        parts.append(f"step {progress['step']}/{progress.get('totalSteps', '?')}")
    if progress.get("epoch") is not None:
        parts.append(f"epoch {progress['epoch']:.2f}")
    if ended:
        parts.append("(ended)")
    elif progress.get("etaSeconds") is not None:
        parts.append(f"ETA {duration(progress['etaSeconds'])}")
    return "  ".join(parts)


def queue_text(queue: Mapping[str, Any], now: dt.datetime) -> str:
    """A queued job's `status.queue` in words: `2nd in line, expected to start in 12m05s (2026-...Z): <basis>`."""
    parts = [f"position {queue['position']}"] if queue.get("position") else []
    start = parse_time(queue.get("expectedStartTime"))
    if start is not None:
        parts.append(f"expected to start in {duration((start - now).total_seconds())} ({queue['expectedStartTime']})")
    return ", ".join(parts) + (": " if parts else "") + str(queue.get("basis", ""))


def _gpu_line(job: Mapping[str, Any], now: dt.datetime) -> str:
    status = job.get("status") or {}
    resources = (job.get("spec") or {}).get("resources") or {}
    workers, per_worker = resources.get("workers", 1), resources.get("gpusPerWorker", 1)
    profile = gpu_kind(resources)
    kind = f" {profile} partitions" if profile not in (None, WHOLE_GPU_KIND) else ""
    parts = [f"{workers * per_worker} requested ({workers} workers x {per_worker}{kind})"]
    if status.get("gpusHeld") is not None:
        parts.append(f"{status['gpusHeld']} held")
    if "gpuSeconds" in status:
        parts.append(f"{gpu_seconds_at(status, now) / 3600:.2f} GPU-hours")
    if cost := status.get("cost"):
        parts.append(f"cost {cost['amount']:.2f} {cost['currency']}")
    return ", ".join(parts)


def network_text(network: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """`status.network` in words: `IB over mlx5_0:1 (RoCE)`, or a Socket transport flagged where the job
    requests RDMA."""
    try:
        text = NetworkTransport.model_validate(network).summary
    except ValidationError:  # written by another version: its transport as it stands
        text = str(network.get("transport"))
    if rdma := unused_rdma(network.get("transport"), spec):
        text += f": not RDMA, although the job requests {rdma}"
    return text


def job_text(
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    node_labels: Mapping[str, Mapping[str, str]],
    now: dt.datetime,
) -> str:
    """The screen of `rocmtrain status` for `job`, its pods, its events and the labels of its nodes."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    phase = Phase.of(status.get("phase"))
    ended = phase is not None and phase.is_terminal
    conditions = [
        c
        for c in status.get("conditions") or []
        if not (ended and c.get("type") == ConditionType.STALLED and c.get("status") == "True")
    ]
    said = next((c.get("message") for c in conditions if c.get("type") == ConditionType.READY), None)
    headline = f"{meta.get('namespace')}/{meta.get('name')}   {status.get('phase') or 'not yet seen by the operator'}"
    if said:
        headline += "   " + said.replace("\n", "\n" + " " * (len(headline) + 3))
    metrics = status.get("metrics") or {}
    shown = [f"{row.heading} {row.text(metrics[row.key])}" for row in metric_rows() if metrics.get(row.key) is not None]
    shown += [f"{metric.get('name')} {metric.get('value'):g}" for metric in metrics.get("custom") or []]
    sections = [
        headline,
        "progress   " + _progress_line(status, ended),
        "GPUs       " + _gpu_line(job, now),
    ]
    if queue := status.get("queue"):
        sections.append("queue      " + queue_text(queue, now))
    if network := status.get("network"):
        sections.append("network    " + network_text(network, job.get("spec") or {}))
    if shown:
        sections.append("metrics    " + _wrapped(shown, METRICS_WIDTH, indent=len("metrics    ")))
    if conditions:
        rows = [
            [
                c.get("type"),
                c.get("status"),
                c.get("reason"),
                _age(c.get("lastTransitionTime"), now),
                "as above" if said and c.get("message") == said else c.get("message"),
            ]
            for c in conditions
        ]
        sections.append(table(["CONDITION", "STATUS", "REASON", "AGE", "MESSAGE"], rows))
    if pods:
        product = GPU_NODE_LABELS["product_name"]
        rows = [
            [
                (p.get("metadata") or {}).get("name"),
                (p.get("status") or {}).get("phase"),
                pod_gpus(p),
                node := (p.get("spec") or {}).get("nodeName"),
                (node_labels.get(node or "") or {}).get(product),
            ]
            for p in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", ""))
        ]
        sections.append(table(["POD", "PHASE", "GPUS", "NODE", "GPU MODEL"], rows))
    if events:
        latest = sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")[-EVENTS_SHOWN:]
        rows = [
            [_age(e.get("lastTimestamp") or e.get("eventTime"), now), e.get("type"), e.get("reason"), e.get("message")]
            for e in latest
        ]
        sections.append(table(["AGE", "TYPE", "REASON", "MESSAGE"], rows))
    return "\n\n".join(sections) + "\n"
