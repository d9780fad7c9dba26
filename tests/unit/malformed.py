"""Malformed job files, as bytes: what a hostile or careless user may hand `rocmtrain`, each refused in one line."""

from __future__ import annotations

import codecs
import random

import yaml

from rocmtrain.api.manifests import DOCUMENT_LIMIT, FILE_LIMIT, MAX_DEPTH, MAX_DOCUMENTS
from unit.samples import minimal_job

JOB = yaml.safe_dump(minimal_job(), sort_keys=False)  # a valid job, as text
HUGE = "9" * 5000


def _job(**replace: str) -> bytes:
    """The valid job's text with `old=new` replacements of whole lines' values (`workers` etc.)."""
    text = JOB
    for old, new in replace.items():
        assert f"{old}:" in text, old
        text = text.replace(f"{old}:", f"{old}: {new} #", 1)
    return text.encode()


def _spliced(line: str) -> bytes:
    """The valid job with `line` (at the top level) appended."""
    return (JOB + line + "\n").encode()


def _nested(depth: int) -> bytes:
    """Block mappings `depth` levels deep, indented by one space a level."""
    return ("".join(f"{' ' * level}a:\n" for level in range(depth)) + " " * depth + "b: 1\n").encode()


def _laughs(merge: bool) -> bytes:
    """The billion laughs: ten levels of nine aliases each (1e9 nodes from a few hundred bytes)."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, 10):
        refs = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(
            f"a{level}: &a{level} {{<<: [{refs}]}}" if merge and level > 1 else f"a{level}: &a{level} [{refs}]"
        )
    return "\n".join(lines).encode() + b"\n"


def wide(keys: int) -> bytes:
    """A job with an emptyDir of `keys` unknown keys: 1.2 MB for 100,000, as the issue measured."""
    volume = ", ".join(f"k{index:05}: 10" for index in range(keys))
    return (JOB + f"  volumes:\n  - name: scratch\n    emptyDir: {{{volume}}}\n").encode()


CORPUS: dict[str, bytes] = {
    # encodings
    "latin-1-in-a-comment": JOB.encode() + "# café\n".encode("latin-1"),
    "latin-1-in-a-value": JOB.replace("minimal", "caf\xe9").encode("latin-1"),
    "utf-16-without-bom": JOB.encode("utf-16-le"),
    "broken-continuation": b"kind: \xc3\x28\n",
    "truncated-multibyte": JOB.encode() + b"# \xe2\x82",
    "overlong-encoding": b"kind: \xc0\xaf\n",
    "encoded-surrogate": b"kind: \xed\xa0\x80\n",
    "utf-16-bom-odd-length": codecs.BOM_UTF16_LE + JOB.encode("utf-16-le") + b"\x00\x00\x41",
    "utf-8-bom-then-latin-1": codecs.BOM_UTF8 + b"kind: caf\xe9\n",
    "utf-8-bom-wrong-kind": codecs.BOM_UTF8 + _job(kind="Deployment"),
    "utf-16-bom-wrong-kind": codecs.BOM_UTF16_LE + _job(kind="Deployment").decode().encode("utf-16-le"),
    "utf-32-bom": codecs.BOM_UTF32_LE + JOB.encode("utf-32-le"),
    "bom-mid-document": _spliced("\ufeffextra: 1"),
    "nul-bytes": JOB.encode() + b"\x00\x00\n",
    "bell-character": b"kind: \x07\n",
    "binary-junk": random.Random(49).randbytes(4096),
    "png-header": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64),
    "gzip-member": b"\x1f\x8b\x08\x00" + bytes(32),
    # numbers
    "5000-digit-integer": _job(numLabels=HUGE),
    "5000-digit-negative-integer": _job(numLabels="-" + HUGE),
    "5000-digit-hex-integer": _job(numLabels="0x" + "f" * 5000),
    "5000-digit-binary-integer": _job(numLabels="0b" + "1" * 5000),
    "5000-digit-sexagesimal": _job(numLabels=":".join(["59"] * 2500)),
    "integer-just-beyond-64-bits": _job(numLabels=str(1 << 63)),
    "infinite-float": _job(numLabels="1e99999"),
    "not-a-number": _job(numLabels=".nan"),
    "impossible-date": _spliced("created: 2024-02-30"),
    "impossible-time": _spliced("created: 2024-01-01T25:61:00Z"),
    # nesting
    "3000-flow-sequences": ("a: " + "[" * 3000 + "]" * 3000 + "\n").encode(),
    "3000-flow-mappings": ("a: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n").encode(),
    "3000-block-mappings": _nested(3000),
    "1400-block-mappings-under-the-size-limit": _nested(1400),
    "3000-block-sequences": ("- " * 3000 + "1\n").encode(),
    "3000-block-sequences-in-a-mapping": ("a:\n" + "- " * 3000 + "b: 1\n").encode(),
    "one-level-too-deep": _nested(MAX_DEPTH),
    "unbalanced-brackets": ("a: " + "[" * 100 + "\n").encode(),
    # anchors and aliases
    "billion-laughs": _laughs(merge=False),
    "billion-laughs-by-merge-keys": _laughs(merge=True),
    "recursive-alias": b"a: &a [1, *a]\n",
    "recursive-merge": b"a: &a {<<: *a}\n",
    "undefined-alias": _spliced("extra: *nowhere"),
    "merge-of-a-scalar": _spliced("extra: {<<: 1}"),
    # duplicate keys
    "duplicate-kind": _spliced("kind: RocmTrainingJob"),
    "duplicate-nested-key": JOB.replace("spec:\n", "spec:\n  model: {}\n", 1).encode(),
    "duplicate-in-a-flow-mapping": _spliced("extra: {a: 1, a: 2}"),
    "duplicate-quoted-and-plain": _spliced('"kind": RocmTrainingJob'),
    "duplicate-in-a-list-item": _spliced("extra:\n- name: a\n  value: b\n  name: c"),
    "duplicate-long-key": ("k" * 1000 + ": 1\n" + "k" * 1000 + ": 2\n").encode(),
    "duplicate-alias-keys": b"a: &k key\n? *k\n: 1\n? *k\n: 2\n",
    # syntax
    "tab-indentation": JOB.replace("  ", "\t", 1).encode(),
    "tab-before-a-value": b"kind:\n\t- RocmTrainingJob\n",
    "unclosed-double-quote": _spliced('extra: "never closed'),
    "unclosed-single-quote": _spliced("extra: 'never closed"),
    "unclosed-flow-mapping": _spliced("extra: {a: 1"),
    "bad-indentation": b"kind: RocmTrainingJob\n  spec: 1\n spec2: 2\n",
    "two-values-on-a-line": b"kind: RocmTrainingJob: other\n",
    "python-object-tag": _spliced("extra: !!python/object/apply:os.system ['true']"),
    "unknown-tag": _spliced("extra: !frobnicate 1"),
    "undefined-tag-handle": _spliced("extra: !x!y 1"),
    "invalid-binary": _spliced("extra: !!binary QQ"),
    "unhashable-key": _spliced("? [a, b]\n: 1"),
    "yaml-2.0-directive": b"%YAML 2.0\n---\n" + JOB.encode(),
    "unknown-escape": _spliced('extra: "\\q"'),
    "long-unclosed-scalar": ("a: [" + "x" * 100_000 + "\n").encode(),
    "crlf-with-tab": JOB.replace("\n", "\r\n").replace("  ", "\t", 1).encode(),
    # documents and roots
    "empty": b"",
    "whitespace-only": b" \n\t\n  \n",
    "comments-only": b"# a job\n# another\n",
    "document-end-only": b"...\n",
    "markers-only": b"---\n---\n...\n",
    "null-root": b"~\n",
    "scalar-root": b"hello\n",
    "integer-root": b"42\n",
    "list-root": b"- kind: RocmTrainingJob\n",
    "json-array": b'[{"kind": "RocmTrainingJob"}]',
    "string-document": b"--- !!str\n" + JOB.encode(),
    "valid-then-junk": JOB.encode() + b"---\n]\n",
    "valid-then-list": JOB.encode() + b"---\n- 1\n",
    "wrong-kind": _job(kind="Deployment"),
    "wrong-api-version": _job(apiVersion="apps/v1"),
    "too-many-documents": b"---\n" * (MAX_DOCUMENTS + 1),
    "document-over-the-limit": wide(100_000),
    "file-over-the-limit": b"#" * (FILE_LIMIT + 1),
}
assert len(JOB) < DOCUMENT_LIMIT
