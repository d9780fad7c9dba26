"""Plain-language descriptions of the API's string patterns, for error messages and the field reference."""

from __future__ import annotations

from rocmtrain.api import types

PATTERN_DESCRIPTIONS = {
    types.DNS_LABEL: "a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit",
    types.DNS_1035_LABEL: "a DNS-1035 label: lowercase letters, digits and '-', starting with a letter",
    types.DNS_SUBDOMAIN: "a DNS-1123 subdomain: lowercase DNS labels joined by '.'",
    types.QUANTITY: "a resource quantity such as 500m, 2, 1.5 or 16Gi",
    types.LABEL_KEY: "a label key: an optional DNS prefix and '/', then letters, digits, '-', '_' or '.'",
    types.LABEL_VALUE: "a label value: up to 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric",
    types.ENV_NAME: "an environment variable name: letters, digits and '_', not starting with a digit",
    types.IMAGE: "a container image reference such as registry.example.com/team/image:tag",
    types.LOCATION: (
        "an absolute path, an object-store URI (s3://, gs://, gcs://, abfs://, az://), a hub id "
        "(org/name or hf://...), or (rocmtrain run only) a ./relative path; "
        "no whitespace, quotes or shell metacharacters"
    ),
    types.ABS_PATH: "an absolute path of letters, digits and ._~%+=,@/- only",
    types.FIELD_NAME: "a record field name: letters, digits, '_', '.' or '-', starting with a letter or '_'",
    types.CONFIG_KEY: "a Secret or ConfigMap key: letters, digits, '-', '_' or '.'",
    types.REL_PATH: "a relative path of letters, digits, '.', '_' and '-' segments",
    r"^[^\x00]*$": "text without NUL characters",
}


def describe_pattern(pattern: str) -> str:
    """The description of a pattern, or the pattern itself when it has none."""
    return PATTERN_DESCRIPTIONS.get(pattern, f"matching {pattern}")
