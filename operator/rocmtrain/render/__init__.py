"""Render a RocmTrainingJob into a KubeRay RayJob (pure functions, no I/O).

The builders are split by what they build, in the style of KubeRay's `common/`
package: `rayjob` (the object, and the fields that follow the job after
creation), `rayjob_update` (what may change in a RayJob that exists), `pod` (pod
templates, scheduling), `container`, `env`, `volumes`, `network_policy` (the
NetworkPolicy around the Ray pods), and `options` (what the operator supplies).
The names KubeRay derives from a job are in `rocmtrain.api.names`, where validation checks them; every name the renderer
shares with the operator or the training image is in `rocmtrain.api.contract`.
"""

from rocmtrain.render.network_policy import render_network_policy
from rocmtrain.render.options import RenderOptions
from rocmtrain.render.rayjob import ENTRYPOINT, render_rayjob, render_rayjob_yaml

__all__ = ["ENTRYPOINT", "RenderOptions", "render_network_policy", "render_rayjob", "render_rayjob_yaml"]
