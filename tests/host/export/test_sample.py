"""`coppelius sample`: the checkpoint's export continued by `transformers`' generate — greedy is
the reference's argmax, a seeded sample repeats, and bad options are refused before any work."""
import json

import numpy as np
import pytest

from coppelius.cli import main
from coppelius.plan import profiles as P
from coppelius.plan import reference as ref
from tests.support.tolerances import ONE_BF16_ULP

pytest.importorskip("torch", reason="sampling runs the export in torch")
pytest.importorskip("transformers", reason="the `hf` extra (transformers) is not installed: "
                    "pip install -e '.[hf]'")
pytest.importorskip("safetensors", reason="the `hf` extra (safetensors) is not installed")

PROMPT = "def main(argv):\n    "
NEW = 4


def _sample(capsys, *args) -> dict:
    assert main(["sample", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_greedy_continues_with_the_references_most_likely_tokens(tiny_checkpoint, capsys):
    path, plane = tiny_checkpoint
    rep = _sample(capsys, str(path), "--prompt", PROMPT, "--max-new-tokens", str(NEW))
    prof = P.get("tiny")
    assert rep["mode"] == "greedy" and rep["profile"] == "tiny"
    assert len(rep["new_ids"]) == NEW or rep["stopped"] == "end of text"
    # the reference's argmax, one token at a time, over the same ids (padded to the context):
    # where its best two logits are further apart than the round trip's tolerance, they agree
    ids = list(rep["prompt_ids"])
    for new in rep["new_ids"]:
        ctx = np.zeros(prof.context, np.int64)
        ctx[:len(ids)] = ids
        row = ref.forward(prof, plane, ctx)[len(ids) - 1]
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] > ONE_BF16_ULP * np.abs(row).max():
            assert new == int(row.argmax())
        ids.append(new)
    assert rep["text"] and isinstance(rep["text"], str)


def test_a_seeded_sample_repeats_and_another_seed_differs(tiny_checkpoint, capsys):
    path = str(tiny_checkpoint[0])
    args = (path, "--prompt", PROMPT, "--max-new-tokens", "12", "--temperature", "1.5",
            "--top-k", "50")
    a = _sample(capsys, *args, "--seed", "1")
    b = _sample(capsys, *args, "--seed", "1")
    c = _sample(capsys, *args, "--seed", "2")
    assert a["new_ids"] == b["new_ids"] and a["mode"] == "sample" and a["top_k"] == 50
    assert a["new_ids"] != c["new_ids"]


def test_text_output_and_refusals(tiny_checkpoint, capsys):
    path = str(tiny_checkpoint[0])
    assert main(["sample", path, "--prompt", "", "--max-new-tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert "new tokens (greedy" in out
    for bad, what in ((["--temperature", "0"], "temperature"), (["--top-k", "-1"], "top-k"),
                      (["--max-new-tokens", "0"], "max-new-tokens"),
                      (["--greedy", "--seed", "3"], "--greedy"),
                      (["--max-new-tokens", "1024"], "context")):
        assert main(["sample", path, "--prompt", "x", *bad]) == 2, bad
        err = capsys.readouterr().err
        assert what in err and "hint:" in err and "Traceback" not in err, err
