"""The GGUF header reader (standard library only) reads what gguf-py's GGUFReader reads: every metadata
value and every tensor's name, shape, type and byte size; plan --model FILE.gguf imports neither gguf nor
numpy; a file that is not GGUF is one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmfleet.errors import UsageError
from llmfleet.knowledge.gguf_header import GGML_TYPES, GGUFError, GGUFHeader
from llmfleet.knowledge.modelinfo import read_model

gguf = pytest.importorskip("gguf")  # the lab extra: it writes the files this test reads
np = pytest.importorskip("numpy")


@pytest.fixture
def file(tmp_path):
    f = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(f), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_uint32("llama.embedding_length", 64)
    w.add_uint32("llama.attention.head_count", 4)
    w.add_array("llama.attention.head_count_kv", [2, 2])
    w.add_float32("llama.rope.freq_base", 10000.5)
    w.add_bool("general.flag", True)
    w.add_string("general.name", "tiny ünïcode")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(5000)])  # counted, not decoded
    w.add_array("tokenizer.ggml.scores", [0.5] * 10)
    w.add_file_type(7)
    w.add_tensor("token_embd.weight", np.zeros((256, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_k.weight", np.zeros((32, 64), dtype=np.float16))
    q = np.zeros((64, 64 // 32 * 34), dtype=np.uint8)  # Q8_0 blocks: 32 values in 34 bytes
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return f


def test_it_reads_what_gguf_py_reads(file):
    ours, theirs = GGUFHeader(str(file)), gguf.GGUFReader(str(file), "r")
    assert set(ours.fields) == {k for k in theirs.fields if not k.startswith("GGUF.")}
    for key, field in ours.fields.items():
        want = theirs.fields[key].contents()
        got = field.contents()
        if key == "tokenizer.ggml.tokens":
            assert len(got) == len(want) == 5000
        else:
            assert got == pytest.approx(want) if isinstance(want, float | list) else got == want, key
    assert [(t.name, t.shape, t.tensor_type.name, t.n_elements, t.n_bytes) for t in ours.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), t.tensor_type.name, int(t.n_elements), int(t.n_bytes))
        for t in theirs.tensors]


def test_the_type_table_is_gguf_pys():
    for tid, (name, block, size) in GGML_TYPES.items():
        t = gguf.GGMLQuantizationType(tid)
        assert t.name == name and gguf.GGML_QUANT_SIZES[t] == (block, size)


@pytest.mark.parametrize("data", [b"", b"GGML" + b"\0" * 40, b"GGUF" + (9).to_bytes(4, "little") + b"\0" * 16,
                                  b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little")
                                  + (1).to_bytes(8, "little") + (99).to_bytes(8, "little")])
def test_what_is_not_gguf_is_refused(tmp_path, data):
    f = tmp_path / "x.gguf"
    f.write_bytes(data)
    with pytest.raises((GGUFError, ValueError)):
        GGUFHeader(str(f))
    with pytest.raises(UsageError, match="not a readable GGUF file"):
        read_model(str(f))


def test_reading_a_gguf_file_imports_neither_gguf_nor_numpy(file):
    code = ("import sys; from llmfleet.knowledge.modelinfo import read_model; "
            f"s = read_model({str(file)!r}); print(s.num_layers, s.file_quant); "
            "print([m for m in ('gguf', 'numpy') if m in sys.modules])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    first, mods = res.stdout.splitlines()
    assert first.startswith("2 ") and mods == "[]"
