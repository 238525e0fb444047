"""Write llama-architecture GGUF files with random weights and a real tokenizer (copied from a GGUF),
at realistic shapes: for measuring kernel exactness (batch vs single token) and batch costs on a GPU,
where no real model of that size can be carried. Weights are random bytes in quantized blocks with
fixed scales (std ~0.02), so logits are finite and not degenerate.

    python scripts/gpu/gen_models.py TOKENIZER.gguf OUT_DIR [names...]

Each file is written as NAME.gguf.part and renamed when complete, so an interrupted run leaves no file
that looks whole. Used by scripts/gpu-check.sh (TOKENIZER.gguf: .gpu/tok.gguf, from scripts/gpu-bundle.sh).
"""

import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter

SHAPES = {
    # name: (layers, n_embd, ffn, heads, kv_heads, weight type). Models of one width share their token
    # embeddings, output matrix and layer i (seeded by width and index): a model with fewer layers is the
    # wider one truncated, a draft that agrees with it often (as layer-skip self-drafts do).
    "r8b-q4_0": (32, 4096, 14336, 32, 8, QT.Q4_0),   # Llama-3-8B shape
    "r8b-q4_k": (32, 4096, 14336, 32, 8, QT.Q4_K),
    "r8b-l2-q4_0": (2, 4096, 14336, 32, 8, QT.Q4_0),  # its first 2 layers: a cheap draft
    "r1b-q8_0": (16, 2048, 8192, 32, 8, QT.Q8_0),    # Llama-3.2-1B shape
    "r135m-q4_0": (30, 576, 1536, 9, 3, QT.Q4_0),    # SmolLM2-135M shape (576 wide: no K-quants)
    "r135m-l3-q4_0": (3, 576, 1536, 9, 3, QT.Q4_0),
}
# The residual stream is the token's embedding (std 1) plus small layer outputs (each ~OUT_SCALE), so the
# next token depends mostly on the current one and a little on the context: outputs cycle and vary rather
# than collapse to one token, as a deep random network's do.
OUT_SCALE = 0.03


def signed(x: float, rng: np.random.Generator, rows: int, nb: int) -> np.ndarray:
    v = np.where(rng.random((rows, nb)) < 0.5, -x, x).astype(np.float16)
    return v.view(np.uint8).reshape(rows, nb, 2)


def block(rows: int, cols: int, qt: QT, sigma: float, seed: tuple) -> np.ndarray:
    """Random quantized blocks whose values have standard deviation ~sigma."""
    rng = np.random.default_rng(list(seed))
    if qt == QT.Q8_0:
        nb, size, d, dmin = cols // 32, 34, sigma / 73.9, None
    elif qt == QT.Q4_0:
        nb, size, d, dmin = cols // 32, 18, sigma / 4.61, None
    elif qt == QT.Q4_K:
        nb, size, d, dmin = cols // 256, 144, sigma / (36 * 4.61), sigma / (36 * 4.61) * 7.5
    else:
        raise ValueError(qt)
    a = np.frombuffer(rng.bytes(rows * nb * size), np.uint8).reshape(rows, nb, size).copy()
    # Scales of random sign: quantized values are not centred (Q4_0's are -8..7), and a mean shared by every
    # weight would add up across layers into one direction that decides every token.
    a[:, :, 0:2] = signed(d, rng, rows, nb)
    if dmin is not None:
        a[:, :, 2:4] = signed(dmin, rng, rows, nb)
    return a.reshape(rows, nb * size)


def tokenizer_fields(path: str) -> list[tuple[str, object, list]]:
    r = GGUFReader(path)
    return [(f.name, f.contents(), f.types) for f in r.fields.values() if f.name.startswith("tokenizer.")]


def write(name: str, out: Path, tok: list, n_vocab: int) -> Path:
    layers, d, ffn, heads, kv, qt = SHAPES[name]
    hd = d // heads
    path = out / f"{name}.gguf"
    part = out / f"{name}.gguf.part"
    w = GGUFWriter(str(part), "llama")
    w.add_name(name)
    w.add_uint32("llama.block_count", layers)
    w.add_uint32("llama.context_length", 8192)
    w.add_uint32("llama.embedding_length", d)
    w.add_uint32("llama.feed_forward_length", ffn)
    w.add_uint32("llama.attention.head_count", heads)
    w.add_uint32("llama.attention.head_count_kv", kv)
    w.add_float32("llama.rope.freq_base", 100000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32("llama.vocab_size", n_vocab)
    w.add_uint32("llama.rope.dimension_count", hd)
    for key, val, types in tok:
        if types[0] == GGUFValueType.ARRAY:
            w.add_key_value(key, val, GGUFValueType.ARRAY, sub_type=types[1])
        else:
            w.add_key_value(key, val, types[0])
    ones = np.ones(d, np.float32)
    qid = int(qt)
    w.add_tensor("token_embd.weight", block(n_vocab, d, qt, 1.0, (d, qid, 1)), raw_dtype=qt)
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", block(n_vocab, d, QT.Q8_0, d ** -0.5, (d, 2)), raw_dtype=QT.Q8_0)
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "ffn_norm.weight", ones)
        for j, (t, rows, cols, out) in enumerate((
                ("attn_q", d, d, False), ("attn_k", kv * hd, d, False), ("attn_v", kv * hd, d, False),
                ("attn_output", d, d, True), ("ffn_gate", ffn, d, False), ("ffn_up", ffn, d, False),
                ("ffn_down", d, ffn, True))):
            sigma = cols ** -0.5 * (OUT_SCALE if out else 1.0)
            w.add_tensor(p + t + ".weight", block(rows, cols, qt, sigma, (d, qid, 100 + i, j)), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    part.replace(path)
    return path


def main() -> None:
    tok_path, out = sys.argv[1], Path(sys.argv[2])
    names = sys.argv[3:] or list(SHAPES)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer_fields(tok_path)
    n_vocab = next(len(v) for k, v, _ in tok if k == "tokenizer.ggml.tokens")
    for name in names:
        t = time.time()
        p = write(name, out, tok, n_vocab)
        print(f"{p.name}: {p.stat().st_size / 2**30:.2f} GiB in {time.time() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main()
