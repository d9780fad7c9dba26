"""Settings the operator supplies to the renderer: never taken from the user's spec."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rocmtrain.api.contract import PROGRESS_AUDIENCE, PROGRESS_CA_CONFIGMAP
from rocmtrain.api.patterns import CONFIG_KEY, DNS_SUBDOMAIN

_HTTPS_URL = r"^https://[A-Za-z0-9.-]+(:[0-9]{1,5})?$"
MAX_SUBMITTER_RETRIES = 20


@dataclass(frozen=True)
class RenderOptions:
    """Operator-provided values for the rendered RayJob.

    progress_base_url: scheme, host and port of the operator's progress endpoint
        (`https://host[:port]`); when set, the head pod gets a projected service
        account token and the `ROCMTRAIN_PROGRESS_*` variables.
    progress_ca_configmap: ConfigMap (in the job's namespace) holding the CA bundle
        that signed the endpoint's certificate, under key `progress_ca_key`.
    progress_token_audience: audience of the projected token.
    gpu_device_groups: supplementary groups for GPU worker pods, for nodes where the
        non-root Ray user needs the host's `video`/`render` group to open /dev/kfd and
        /dev/dri (not needed where the container runtime sets device ownership from
        the security context).
    submitter_retries: retries of the submitter Job before the RayJob fails with
        SubmissionFailed (`submitterConfig.backoffLimit`; 2 is KubeRay's default).
    """

    progress_base_url: str | None = None
    progress_ca_configmap: str | None = None
    progress_ca_key: str = "ca.crt"
    progress_token_audience: str = PROGRESS_AUDIENCE
    gpu_device_groups: tuple[int, ...] = ()
    submitter_retries: int = 2

    def __post_init__(self) -> None:
        if self.progress_base_url is not None and not re.fullmatch(_HTTPS_URL, self.progress_base_url):
            raise ValueError(f"progress_base_url must be https://host[:port], not {self.progress_base_url!r}")
        if self.progress_ca_configmap is not None:
            if self.progress_base_url is None:
                raise ValueError("progress_ca_configmap needs progress_base_url")
            if not re.fullmatch(DNS_SUBDOMAIN, self.progress_ca_configmap):
                raise ValueError(f"progress_ca_configmap is not a valid name: {self.progress_ca_configmap!r}")
        if not re.fullmatch(CONFIG_KEY, self.progress_ca_key):
            raise ValueError(f"progress_ca_key is not a valid ConfigMap key: {self.progress_ca_key!r}")
        if not self.progress_token_audience or any(c.isspace() for c in self.progress_token_audience):
            raise ValueError("progress_token_audience must be a non-empty string without whitespace")
        if any(not 0 <= gid <= 2**31 - 1 for gid in self.gpu_device_groups):
            raise ValueError("gpu_device_groups must be group ids between 0 and 2^31-1")
        if not 0 <= self.submitter_retries <= MAX_SUBMITTER_RETRIES:
            raise ValueError(f"submitter_retries must be 0 to {MAX_SUBMITTER_RETRIES}")


# Where the operator's progress endpoint is (its Service in the operator's namespace, or
# ROCMTRAIN_PROGRESS_ADVERTISE_HOST) is known only on the cluster: `rocmtrain render` shows this in its place.
PLACEHOLDER_PROGRESS_URL = "https://PLACEHOLDER-operator-progress-endpoint"


def preview_options() -> RenderOptions:
    """The options `rocmtrain render` renders with: the operator's defaults with its progress endpoint on, as
    `rocmtrain.progress.server.ProgressServerConfig.render_options` gives them, the endpoint's address a placeholder."""
    return RenderOptions(progress_base_url=PLACEHOLDER_PROGRESS_URL, progress_ca_configmap=PROGRESS_CA_CONFIGMAP)
