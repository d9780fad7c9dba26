"""spec.env and references to objects of the job's namespace: a Secret's key, an object by name."""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from rocmtrain.api.models.base import ApiModel, _cel
from rocmtrain.api.types import ConfigKey, DnsSubdomain, EnvName, Text


class LocalObjectReference(ApiModel):
    """A reference to an object in the job's namespace by name."""

    name: DnsSubdomain = Field(description="Object name.")


class SecretKeyRef(ApiModel):
    """A key of a Secret in the job's namespace."""

    name: DnsSubdomain = Field(description="Secret name.")
    key: ConfigKey = Field(description="Key within the Secret.")


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from."""

    secret_key_ref: SecretKeyRef = Field(description="A key of a Secret in the job's namespace.")


class EnvVar(ApiModel):
    """An extra environment variable for the Ray containers."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("!(has(self.value) && has(self.valueFrom))", "set either value or valueFrom, not both")
            ]
        }
    )

    name: EnvName = Field(description="Variable name.")
    value: Text | None = Field(default=None, description="Literal value; only ever data, never run by a shell.")
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a Secret (credentials stay out of the spec)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError("set either value or valueFrom, not both")
        return self
