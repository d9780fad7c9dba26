"""Why the operator holds a job's RayJob back, and when it looks again (pure): pre-flight, KubeRay missing, the
API server refusing the RayJob or the job's NetworkPolicy, a name taken by another object."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.contract import RAYJOB_API_VERSION
from rocmtrain.status.messages import QUOTE_LIMIT, bounded


class HoldKind(enum.Enum):
    """What holds a RayJob back; all but CONFLICT also raise the condition of their name."""

    UNSCHEDULABLE = ConditionType.UNSCHEDULABLE  # pre-flight: no node can ever run the workers
    KUBERAY_MISSING = ConditionType.KUBERAY_MISSING  # the RayJob API is not served
    # Something outside the spec refuses the RayJob: the API server's admission (a
    # quota, a policy, a webhook) or a name the operator must not take over.
    BLOCKED = ConditionType.BLOCKED
    CONFLICT = "Conflict"  # the RayJob's name is taken by an object the job does not own (transient)


@dataclass(frozen=True)
class Hold:
    """Why the operator does not (yet) create or update the RayJob, and when to look again.

    `reason` and `message` become the Ready condition's (and the kind's own condition's);
    `retry_seconds` None means after the operator's `ROCMTRAIN_RETRY_SECONDS`.
    """

    kind: HoldKind
    reason: str
    message: str
    retry_seconds: float | None = None

    def retry_after(self, default: float) -> float:
        """Seconds until the held job is checked again."""
        return default if self.retry_seconds is None else self.retry_seconds


KUBERAY_NOT_INSTALLED = Hold(
    HoldKind.KUBERAY_MISSING,
    Reason.KUBERAY_NOT_INSTALLED,
    f"KubeRay's RayJob API ({RAYJOB_API_VERSION}) is not installed; install the KubeRay operator",
)


def refused_create(status: int, message: str) -> Hold:
    """The hold of a RayJob whose create the API server refused (HTTP `status`, its `message`)."""
    reason = Reason.RAYJOB_FORBIDDEN if status == 403 else Reason.RAYJOB_INVALID
    return Hold(HoldKind.BLOCKED, reason, bounded(f"the API server refused the RayJob: {message}", QUOTE_LIMIT))


def refused_network_policy(status: int, message: str) -> Hold:
    """The hold of a job whose NetworkPolicy the API server refused: no Ray pod runs unprotected."""
    text = f"the API server refused the job's NetworkPolicy (HTTP {status}): {message}"
    return Hold(HoldKind.BLOCKED, Reason.NETWORK_POLICY_REFUSED, bounded(text, QUOTE_LIMIT))
