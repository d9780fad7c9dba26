"""spec.volumes and spec.volumeMounts: the Kubernetes volume sources a job may mount, and where."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_snake

from rocmtrain.api.models.base import ApiModel, _cel
from rocmtrain.api.models.env import LocalObjectReference
from rocmtrain.api.patterns import DNS_SUBDOMAIN, FS_TYPE, TEXT
from rocmtrain.api.types import AbsPath, ConfigKey, DnsLabel, DnsSubdomain, LabelKey, Quantity, RelPath


class PersistentVolumeClaimSource(ApiModel):
    """A PersistentVolumeClaim in the job's namespace."""

    claim_name: DnsSubdomain = Field(description="Name of the PersistentVolumeClaim.")
    read_only: bool = Field(default=False, description="Mount the claim read-only.")


FileMode = Annotated[int, Field(ge=0, le=0o777)]
# Files one ConfigMap or Secret volume may pick (Kubernetes has no limit; a pod rarely needs a dozen).
MAX_VOLUME_ITEMS = 64


class KeyToPath(ApiModel):
    """One key of a ConfigMap or Secret, projected as a file."""

    key: ConfigKey = Field(description="Key within the ConfigMap or Secret.")
    path: RelPath = Field(description="File path, relative to the mount.")
    mode: FileMode | None = Field(default=None, description="File mode bits (0-0777); defaultMode if unset.")


class ProjectedKeys(ApiModel):
    """What a ConfigMap and a Secret volume share: the keys to project and the files' mode."""

    items: list[KeyToPath] | None = Field(
        default=None,
        max_length=MAX_VOLUME_ITEMS,
        description="Keys to project; every key as a file of its name if unset.",
    )
    default_mode: FileMode | None = Field(default=None, description="Mode bits of the files (0-0777).")
    optional: bool | None = Field(default=None, description="Start the pod even if the object or a key is missing.")


class ConfigMapVolumeSource(ProjectedKeys):
    """A ConfigMap in the job's namespace, projected as files."""

    name: DnsSubdomain = Field(description="ConfigMap name.")


class SecretVolumeSource(ProjectedKeys):
    """A Secret in the job's namespace, projected as files."""

    secret_name: DnsSubdomain = Field(description="Secret name.")


class EmptyDirVolumeSource(ApiModel):
    """Scratch space that lives as long as the pod."""

    medium: Literal["", "Memory"] | None = Field(
        default=None, description="Memory for a tmpfs (counts towards the container's memory); node disk if unset."
    )
    size_limit: Quantity | None = Field(default=None, description="Most the volume may hold, e.g. 20Gi.")


class NfsVolumeSource(ApiModel):
    """An NFS export."""

    server: DnsSubdomain = Field(description="Host name or IPv4 address of the NFS server.")
    path: AbsPath = Field(description="Path exported by the server.")
    read_only: bool | None = Field(default=None, description="Mount the export read-only.")


CSI_ATTRIBUTES = 32
CsiAttribute = Annotated[str, StringConstraints(pattern=TEXT, max_length=1024)]


class CsiVolumeSource(ApiModel):
    """A CSI volume, for example an object-store FUSE driver."""

    driver: Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, max_length=63)] = Field(
        description="Name of the CSI driver, e.g. s3.csi.aws.com."
    )
    read_only: bool | None = Field(default=None, description="Mount the volume read-only.")
    fs_type: Annotated[str, StringConstraints(pattern=FS_TYPE, max_length=16)] | None = Field(
        default=None, description="Filesystem type, e.g. ext4; the driver's default if unset."
    )
    volume_attributes: dict[LabelKey, CsiAttribute] | None = Field(
        default=None,
        max_length=CSI_ATTRIBUTES,
        description="Driver-specific attributes: at most 32, keys shaped like label keys, values of at most "
        "1,024 characters.",
    )
    node_publish_secret_ref: LocalObjectReference | None = Field(
        default=None, description="Secret with the credentials the driver needs to mount the volume."
    )


class StorageRequest(ApiModel):
    """The size an ephemeral volume asks for."""

    storage: Quantity = Field(description="Capacity, e.g. 100Gi.")


class ClaimResources(ApiModel):
    """Resources of an ephemeral volume's claim."""

    requests: StorageRequest = Field(description="Requested capacity.")


class EphemeralClaimSpec(ApiModel):
    """The PersistentVolumeClaim that an ephemeral volume creates for each pod."""

    access_modes: list[Literal["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]] = Field(
        min_length=1, max_length=4, description="Access modes of the claim."
    )
    resources: ClaimResources = Field(description="Requested capacity.")
    storage_class_name: DnsSubdomain | None = Field(
        default=None, description="StorageClass; the cluster's default if unset."
    )
    volume_mode: Literal["Filesystem", "Block"] | None = Field(default=None, description="Filesystem if unset.")


class EphemeralClaimTemplate(ApiModel):
    """Template of the claim an ephemeral volume creates."""

    spec: EphemeralClaimSpec = Field(description="The claim's spec.")


class EphemeralVolumeSource(ApiModel):
    """A generic ephemeral volume: a claim created with the pod and deleted with it."""

    volume_claim_template: EphemeralClaimTemplate = Field(description="The claim to create.")


VOLUME_SOURCES = ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "nfs", "csi", "ephemeral")


class Volume(ApiModel):
    """A pod volume: a name and exactly one source (hostPath is not offered)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "[" + ", ".join(f"has(self.{s})" for s in VOLUME_SOURCES) + "].filter(x, x).size() == 1",
                    "a volume needs exactly one source of: " + ", ".join(VOLUME_SOURCES),
                )
            ],
        },
    )

    name: DnsLabel = Field(description="Volume name, referenced by volumeMounts.")
    persistent_volume_claim: PersistentVolumeClaimSource | None = Field(
        default=None, description="A PersistentVolumeClaim (shared storage for data, models and checkpoints)."
    )
    config_map: ConfigMapVolumeSource | None = Field(default=None, description="A ConfigMap projected as files.")
    secret: SecretVolumeSource | None = Field(default=None, description="A Secret projected as files.")
    empty_dir: EmptyDirVolumeSource | None = Field(
        default=None, description="Scratch space that lives as long as the pod."
    )
    nfs: NfsVolumeSource | None = Field(default=None, description="An NFS export.")
    csi: CsiVolumeSource | None = Field(
        default=None, description="A CSI volume (for example an object-store FUSE driver)."
    )
    ephemeral: EphemeralVolumeSource | None = Field(default=None, description="A generic ephemeral volume.")

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        if sum(getattr(self, to_snake(s)) is not None for s in VOLUME_SOURCES) != 1:
            raise ValueError("a volume needs exactly one source of: " + ", ".join(VOLUME_SOURCES))
        return self

    @property
    def source(self) -> str:
        """The kind of its source, as the API spells it (`persistentVolumeClaim`, `emptyDir`, ...)."""
        return next(s for s in VOLUME_SOURCES if getattr(self, to_snake(s)) is not None)

    @property
    def read_only_source(self) -> bool:
        """Whether its source's own `readOnly` makes it read-only (a claim, an NFS export, a CSI volume)."""
        source = self.persistent_volume_claim or self.nfs or self.csi
        return bool(source is not None and source.read_only)


class VolumeMount(ApiModel):
    """Where a volume appears inside the Ray containers."""

    name: DnsLabel = Field(description="Name of a volume in spec.volumes.")
    mount_path: AbsPath = Field(description="Absolute mount path.")
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: RelPath | None = Field(default=None, description="Relative path inside the volume to mount.")
