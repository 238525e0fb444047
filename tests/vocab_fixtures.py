"""Vocabulary-only GGUF files built with the `gguf` package from the packaged SmolLM2 tokenizer,
each differing from a reference in one way that pair-check must notice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType, GGUFWriter

Edit = Callable[[dict[str, Any]], None]


def write_vocab_gguf(reader: GGUFReader, out: Path, edit: Edit | None = None) -> Path:
    fields: dict[str, Any] = {}
    types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        vtype = GGUFValueType(f.types[0])
        sub = GGUFValueType(f.types[-1]) if vtype == GGUFValueType.ARRAY else None
        fields[name] = f.contents()
        types[name] = (vtype, sub)
    if edit:
        edit(fields)
    arch = fields.pop("general.architecture")
    w = GGUFWriter(str(out), arch)
    for name, val in fields.items():
        vtype, sub = types.get(name, (GGUFValueType.BOOL, None))
        if name not in types:  # a key the edit added
            vtype = GGUFValueType.BOOL if isinstance(val, bool) else GGUFValueType.UINT32
        w.add_key_value(name, val, vtype, sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def pad(n: int) -> Edit:
    def edit(f: dict[str, Any]) -> None:
        f["tokenizer.ggml.tokens"] = list(f["tokenizer.ggml.tokens"]) + [f"<extra_pad_{i}>" for i in range(n)]
        f["tokenizer.ggml.token_type"] = list(f["tokenizer.ggml.token_type"]) + [5] * n  # UNUSED
        if "tokenizer.ggml.scores" in f:
            f["tokenizer.ggml.scores"] = list(f["tokenizer.ggml.scores"]) + [0.0] * n

    return edit


def change_text(token_id: int, text: str) -> Edit:
    def edit(f: dict[str, Any]) -> None:
        tokens = list(f["tokenizer.ggml.tokens"])
        tokens[token_id] = text
        f["tokenizer.ggml.tokens"] = tokens

    return edit


def set_key(key: str, value: Any, *more: Edit) -> Edit:
    def edit(f: dict[str, Any]) -> None:
        f[key] = value
        for m in more:
            m(f)

    return edit


def with_chat_template(src: Path, out: Path, template: str) -> Path:
    """A loadable copy of a GGUF (tensors and all) whose chat template is `template`."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = GGUFReader(str(src), "r")
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(out), arch=arch, endianess=reader.endianess)
    alignment = reader.fields.get("general.alignment")
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    details = MetadataDetails(GGUFValueType.STRING, template)
    copy_with_new_metadata(reader, writer, {gguf.Keys.Tokenizer.CHAT_TEMPLATE: details}, [])
    return out
