"""Render a RocmTrainingJob into a KubeRay RayJob (pure functions, no I/O).

The builders are split by what they build, in the style of KubeRay's `common/`
package: `rayjob` (the object), `pod` (pod templates, scheduling), `container`,
`env`, `volumes`, and `names` (names KubeRay derives, checked by validation).
"""

from rocmtrain.render.names import rayjob_name, worker_group_name
from rocmtrain.render.options import RenderOptions
from rocmtrain.render.rayjob import (
    ENTRYPOINT,
    KUBERAY_VERSION,
    RAY_VERSION,
    render_rayjob,
    render_rayjob_yaml,
)

__all__ = [
    "ENTRYPOINT",
    "KUBERAY_VERSION",
    "RAY_VERSION",
    "RenderOptions",
    "rayjob_name",
    "render_rayjob",
    "render_rayjob_yaml",
    "worker_group_name",
]
