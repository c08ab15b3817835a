"""Tiny real models for the lab, generated offline and deterministically (same seed -> same bytes).

- ``write_gguf``: a GGUF file (qwen2 architecture, 2 layers, hidden 64, 4 heads, 2 KV heads) with a
  GPT-2 style byte-level BPE vocabulary, ChatML special tokens and an embedded chat template. The real
  llama-server loads it and chats (random weights: the text is gibberish, but printable and
  deterministic at temperature 0).
- ``write_hf``: a Hugging Face folder (Qwen2ForCausalLM, hidden 128, 4 heads of 32, 2 KV heads,
  2 layers; safetensors, tokenizer.json made with `tokenizers`, tokenizer_config.json with the chat
  template) that vLLM's CPU backend serves (its attention needs head size >= 32).

Both share one vocabulary (``build_vocab``), computed by a small deterministic BPE training on the
text below. Output logits exist only for printable tokens, so greedy decoding never emits control
bytes or special tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GGUF_NAME = "tiny-qwen2-gguf"
HF_NAME = "tiny-qwen2-hf"
GGUF_FILE = "tiny-qwen2.gguf"

_CORPUS = (
    "the lab serves a tiny model on every host. the fleet deploys the server, checks its health, "
    "and rolls back when the health check fails. hello world, this is a test of the inference server. "
    "models are staged on each host under srv models. the operator reads the plan before the deploy. "
    "a token is a piece of text; the server streams tokens back to the client one chunk at a time."
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode mapping (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]  # byte-level strings, then merges, then special tokens
    merges: list[tuple[str, str]]
    n_special: int

    @property
    def special_ids(self) -> dict[str, int]:
        base = len(self.tokens) - self.n_special
        return {t: base + i for i, t in enumerate(SPECIAL_TOKENS)}

    def printable_ids(self) -> list[int]:
        b2u = bytes_to_unicode()
        u2b = {v: k for k, v in b2u.items()}
        out = []
        for i, tok in enumerate(self.tokens[: len(self.tokens) - self.n_special]):
            raw = bytes(u2b[c] for c in tok)
            if all(32 <= b < 127 for b in raw):
                out.append(i)
        return out


def build_vocab(n_merges: int = 160) -> Vocab:
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    words = []
    for i, word in enumerate(_CORPUS.split(" ")):
        text = ("" if i == 0 else " ") + word
        words.append([b2u[b] for b in text.encode()])
    merges: list[tuple[str, str]] = []
    known = set(tokens)
    for _ in range(n_merges):
        counts: dict[tuple[str, str], int] = {}
        for w in words:
            for a, b in zip(w, w[1:], strict=False):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        best = max(sorted(counts), key=lambda p: counts[p])  # ties: lexicographic, deterministic
        if counts[best] < 2:
            break
        merged = best[0] + best[1]
        merges.append(best)
        if merged not in known:
            tokens.append(merged)
            known.add(merged)
        new_words = []
        for w in words:
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words.append(out)
        words = new_words
    return Vocab(tokens=tokens + SPECIAL_TOKENS, merges=merges, n_special=len(SPECIAL_TOKENS))


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    layers: int
    ffn: int
    ctx: int = 512


GGUF_SHAPE = Shape(hidden=64, heads=4, kv_heads=2, layers=2, ffn=128)
HF_SHAPE = Shape(hidden=128, heads=4, kv_heads=2, layers=2, ffn=256)


def _weights(shape: Shape, vocab: Vocab, seed: int) -> dict[str, np.ndarray]:
    """HF-named float32 weights. Output rows exist only for printable tokens."""
    rng = np.random.default_rng(seed)
    h, hd = shape.hidden, shape.hidden // shape.heads
    kv = shape.kv_heads * hd
    n = len(vocab.tokens)

    def mat(rows: int, cols: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": mat(n, h, 0.5)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        w[p + "self_attn.q_proj.weight"] = mat(h, h)
        w[p + "self_attn.q_proj.bias"] = np.zeros(h, dtype=np.float32)
        w[p + "self_attn.k_proj.weight"] = mat(kv, h)
        w[p + "self_attn.k_proj.bias"] = np.zeros(kv, dtype=np.float32)
        w[p + "self_attn.v_proj.weight"] = mat(kv, h)
        w[p + "self_attn.v_proj.bias"] = np.zeros(kv, dtype=np.float32)
        w[p + "self_attn.o_proj.weight"] = mat(h, h)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
        w[p + "mlp.gate_proj.weight"] = mat(shape.ffn, h)
        w[p + "mlp.up_proj.weight"] = mat(shape.ffn, h)
        w[p + "mlp.down_proj.weight"] = mat(h, shape.ffn)
    w["model.norm.weight"] = np.ones(h, dtype=np.float32)
    head = np.zeros((n, h), dtype=np.float32)
    keep = vocab.printable_ids()
    head[keep] = mat(len(keep), h, 1.0)
    w["lm_head.weight"] = head
    return w


_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_tensor_name(hf: str) -> str:
    if hf in _GGUF_NAMES:
        return _GGUF_NAMES[hf]
    _, _, idx, rest = hf.split(".", 3)
    return f"blk.{idx}.{_GGUF_NAMES[rest]}"


def write_gguf(path: str | Path, seed: int = 0, shape: Shape = GGUF_SHAPE) -> Path:
    """``shape``: another size of the same model (a larger one makes decode slow enough to time)."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vocab = build_vocab()
    special = vocab.special_ids
    tmp = path.with_suffix(path.suffix + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "qwen2")
    w.add_name("llmfleet tiny qwen2 (lab)")
    w.add_context_length(shape.ctx)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(vocab.tokens)
    n_normal = len(vocab.tokens) - vocab.n_special
    w.add_token_types([gguf.TokenType.NORMAL] * n_normal + [gguf.TokenType.CONTROL] * vocab.n_special)
    w.add_token_merges([f"{a} {b}" for a, b in vocab.merges])
    w.add_bos_token_id(special["<|endoftext|>"])
    w.add_eos_token_id(special["<|im_end|>"])
    w.add_pad_token_id(special["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)
    for name, arr in _weights(shape, vocab, seed).items():
        w.add_tensor(gguf_tensor_name(name), arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path


def hf_config(vocab_size: int, shape: Shape = HF_SHAPE, eos: int = 0, bos: int = 0) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.ffn,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.hidden // shape.heads,
        "max_position_embeddings": shape.ctx,
        "max_window_layers": shape.layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab_size,
        "bos_token_id": bos,
        "eos_token_id": eos,
    }


def write_hf(folder: str | Path, seed: int = 0) -> Path:
    from safetensors.numpy import save_file
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = build_vocab()
    special = vocab.special_ids
    n_normal = len(vocab.tokens) - vocab.n_special
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab.tokens[:n_normal])},
                               merges=list(vocab.merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.save(str(folder / "tokenizer.json"))
    added = {str(special[t]): {"content": t, "lstrip": False, "rstrip": False, "normalized": False,
                               "single_word": False, "special": True} for t in SPECIAL_TOKENS}
    files = {
        "config.json": hf_config(len(vocab.tokens), eos=special["<|im_end|>"], bos=special["<|endoftext|>"]),
        "generation_config.json": {"bos_token_id": special["<|endoftext|>"], "eos_token_id": special["<|im_end|>"],
                                   "do_sample": False},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": HF_SHAPE.ctx,
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHATML_TEMPLATE,
            "added_tokens_decoder": added,
        },
        "special_tokens_map.json": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                    "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]},
    }
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    save_file(_weights(HF_SHAPE, vocab, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def generate(out_dir: str | Path, seed: int = 0) -> dict[str, Path]:
    """Both models under ``out_dir`` (``<out_dir>/<name>/``); returns name -> folder."""
    out = Path(out_dir)
    write_gguf(out / GGUF_NAME / GGUF_FILE, seed)
    write_hf(out / HF_NAME, seed)
    return {GGUF_NAME: out / GGUF_NAME, HF_NAME: out / HF_NAME}
