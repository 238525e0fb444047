"""The vocabulary of a loaded model, llama.cpp's `llama_vocab` handle: ids, texts, tokenize, detokenize."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

from specdec_cli.engine.gguf import SpecialTexts, VocabInfo
from specdec_cli.engine.native import encode_utf8
from specdec_cli.engine.specials import ControlTexts


class Vocab:
    """Owned by a `Model`, which hands it `handle`: the vocabulary pointer, or a UsageError once the
    model is closed (llama.cpp must never get a freed pointer)."""

    def __init__(self, C: Any, handle: Callable[[], Any]) -> None:  # noqa: N803
        self._C = C
        self._handle = handle
        self.n_vocab = int(C.llama_vocab_n_tokens(handle()))
        self._pieces: dict[int, bytes] = {}
        self._eog: frozenset[int] | None = None
        self._controls: ControlTexts | None = None
        self._control_ids: frozenset[int] | None = None

    def info(self) -> VocabInfo:
        C = self._C  # noqa: N806
        v = self._handle()
        get_text, get_attr = C.llama_vocab_get_text, C.llama_vocab_get_attr
        texts = tuple(get_text(v, i) or b"" for i in range(self.n_vocab))
        special_mask = (1 << 3) | (1 << 4)  # LLAMA_TOKEN_ATTR_CONTROL | USER_DEFINED
        special = frozenset(i for i in range(self.n_vocab) if get_attr(v, i) & special_mask)
        return VocabInfo(
            n_vocab=self.n_vocab,
            vocab_type=int(C.llama_vocab_type(v)),
            bos=int(C.llama_vocab_bos(v)),
            eos=int(C.llama_vocab_eos(v)),
            eot=int(C.llama_vocab_eot(v)),
            add_bos=bool(C.llama_vocab_get_add_bos(v)),
            add_eos=bool(C.llama_vocab_get_add_eos(v)),
            texts=texts,
            eog_ids=self.eog_ids,
            special_ids=special,
        )

    def special_texts(self) -> SpecialTexts:
        """BOS/EOS texts and flags, without reading the whole vocabulary."""
        C = self._C  # noqa: N806
        v = self._handle()
        bos, eos = int(C.llama_vocab_bos(v)), int(C.llama_vocab_eos(v))

        def text(i: int) -> str:
            return (C.llama_vocab_get_text(v, i) or b"").decode("utf-8", "replace") if i >= 0 else ""

        return SpecialTexts(text(bos), text(eos), bool(C.llama_vocab_get_add_bos(v)))

    def control_ids(self) -> frozenset[int]:
        """Ids of the CONTROL tokens (BOS, EOS, turn markers, unused slots)."""
        if self._control_ids is None:
            C = self._C  # noqa: N806
            v = self._handle()
            self._control_ids = frozenset(i for i in range(self.n_vocab) if C.llama_vocab_get_attr(v, i) & (1 << 3))
        return self._control_ids

    def control_texts(self) -> ControlTexts:
        """Texts of the CONTROL tokens: the only ones llama.cpp parses specially (and only when asked)."""
        if self._controls is None:
            C = self._C  # noqa: N806
            v = self._handle()
            texts = ((C.llama_vocab_get_text(v, i) or b"").decode("utf-8", "replace") for i in sorted(self.control_ids()))
            self._controls = ControlTexts.of(texts)
        return self._controls

    @property
    def eog_ids(self) -> frozenset[int]:
        """End-of-generation tokens (EOS, EOT, <end_of_turn>, ...), per llama.cpp."""
        if self._eog is None:
            is_eog, v = self._C.llama_vocab_is_eog, self._handle()
            self._eog = frozenset(i for i in range(self.n_vocab) if is_eog(v, i))
        return self._eog

    def token_text(self, token: int) -> bytes:
        """The bytes a token renders as (special tokens render as nothing)."""
        piece = self._pieces.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = self._C.llama_token_to_piece(self._handle(), token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._C.llama_token_to_piece(self._handle(), token, buf, -n, 0, False)
            piece = buf.raw[:n]
            self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_text(t) for t in tokens).decode("utf-8", "replace")

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = encode_utf8(text)
        cap = len(data) + 16
        arr = (self._C.llama_token * cap)()
        n = self._C.llama_tokenize(self._handle(), data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (self._C.llama_token * cap)()
            n = self._C.llama_tokenize(self._handle(), data, len(data), arr, cap, add_special, parse_special)
        return list(arr[:n])


class VocabMethods:
    """A model's vocabulary methods, each its `Vocab`'s (`engine.model.Model` has one as `vocab`)."""

    vocab: Vocab

    def vocab_info(self) -> VocabInfo:
        return self.vocab.info()

    def special_texts(self) -> SpecialTexts:
        return self.vocab.special_texts()

    def control_ids(self) -> frozenset[int]:
        return self.vocab.control_ids()

    def control_texts(self) -> ControlTexts:
        return self.vocab.control_texts()

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog_ids

    def token_text(self, token: int) -> bytes:
        return self.vocab.token_text(token)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.vocab.detokenize(tokens)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)
