"""Embedder: shapes, parity with sentence-transformers (recorded) and with the CLI, prompts,
dimensions, threads, and bad input raising Python exceptions."""

import json
import threading

import numpy as np
import pytest

import ragline
from conftest import ROOT, ragline_commands, run_cli

PARITY = ROOT / "tests" / "fixtures" / "parity"


@pytest.fixture(scope="module")
def embedder(model_ready):
    return ragline.Embedder(device="cpu")


@pytest.fixture(scope="module")
def parity_texts():
    return [json.loads(line)["text"] for line in open(PARITY / "texts.jsonl", encoding="utf-8")]


def test_one_text_gives_one_row_of_the_model_dimension(embedder):
    v = embedder.embed(["hi"])
    assert v.shape == (1, 384)
    assert v.dtype == np.float32
    assert embedder.dimension == 384
    assert embedder.max_tokens == 256
    assert embedder.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert abs(float(np.linalg.norm(v[0])) - 1.0) < 1e-5


def test_no_texts_give_an_empty_matrix(embedder):
    assert embedder.embed([]).shape == (0, 384)


def test_vectors_match_sentence_transformers(embedder, parity_texts):
    """The 230 parity texts (51 over the 256-token limit) against the vectors
    sentence-transformers 6.2.0 computed (tests/fixtures/parity, recorded with its versions)."""
    ours = embedder.embed(parity_texts)
    ref = np.load(PARITY / "reference.npy")
    assert ours.shape == ref.shape
    cos = np.sum(ours * ref, axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.9999, f"worst cosine {cos.min()} at text {int(cos.argmin())}"


@pytest.mark.parametrize("cmd", ragline_commands(), ids=lambda c: c[0].rsplit("/", 1)[-1])
def test_vectors_equal_the_clis(embedder, parity_texts, tmp_path, cmd):
    out = tmp_path / "cli.npy"
    run_cli(cmd, "embed", "--input", str(PARITY / "texts.jsonl"), "--output", str(out),
            "--device", "cpu")
    cli = np.load(out)
    ours = embedder.embed(parity_texts)
    assert cli.shape == ours.shape
    assert np.abs(cli - ours).max() <= 1e-6


def test_dimensions_cut_and_renormalise(embedder):
    texts = ["a short text", "another one, a little longer than the first"]
    full = embedder.embed(texts)
    cut = embedder.embed(texts, dimensions=128)
    assert cut.shape == (2, 128)
    expect = full[:, :128] / np.linalg.norm(full[:, :128], axis=1, keepdims=True)
    assert np.abs(cut - expect).max() < 1e-6
    with pytest.raises(ValueError, match="dimensions=400"):
        embedder.embed(texts, dimensions=400)


def test_batch_tokens_do_not_change_vectors(embedder, parity_texts):
    a = embedder.embed(parity_texts[:40], batch_tokens=64)
    b = embedder.embed(parity_texts[:40])
    assert np.abs(a - b).max() < 1e-5


def test_prompts_go_before_the_text(model_ready):
    e = ragline.Embedder(device="cpu", query_prompt="query: ", document_prompt="passage: ")
    plain = ragline.Embedder(device="cpu")
    q = e.embed_query(["what is a hook"])
    assert np.abs(q - plain.embed(["query: what is a hook"])).max() < 1e-5
    d = e.embed_documents(["hooks let you use state"])
    assert np.abs(d - plain.embed(["passage: hooks let you use state"])).max() < 1e-5
    # MiniLM has no named prompts: a name it lacks is refused with the names it has.
    with pytest.raises(ValueError, match="prompt_name"):
        plain.embed(["x"], prompt_name="query")


def test_two_threads_embed_at_once_with_the_serial_results(embedder, parity_texts):
    serial = embedder.embed(parity_texts)
    results = {}

    def work(i):
        results[i] = embedder.embed(parity_texts)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert np.abs(results[i] - serial).max() < 1e-6


def test_a_non_string_is_named_by_its_index(embedder):
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        embedder.embed(["fine", 3, "fine"])
    with pytest.raises(TypeError, match="not one str"):
        embedder.embed("one string")
    with pytest.raises(TypeError, match="list of str"):
        embedder.embed(42)


def test_a_missing_model_raises_naming_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ragline.RaglineError, match="no-such-model"):
        ragline.Embedder(str(missing))
    with pytest.raises(ValueError, match="device"):
        ragline.Embedder(device="tpu")


def test_cli_embed_json_rows_match(embedder, tmp_path):
    """`ragline embed` JSONL output, through the console script, has the Embedder's rows."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "hello"}\n{"id": "b", "text": "world"}\n')
    out = tmp_path / "out.jsonl"
    run_cli(ragline_commands()[0], "embed", "-i", str(src), "-o", str(out), "--device", "cpu")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ours = embedder.embed(["hello", "world"])
    assert [r["id"] for r in rows] == ["a", "b"]
    assert np.abs(np.array([r["vector"] for r in rows]) - ours).max() <= 1e-6
