"""Diagnostic: the fixed 1,024-token request, and the program alone reached through the engine."""

import numpy as np
import torch

from boundgen.bench.diagnostic import fixed_request, program_alone, run_diagnostic
from boundgen.artifact.program import ScoreSpec
from boundgen.programs.eager import eager_engine
from boundgen.text.tokenizer import Tokenizer


def test_fixed_request_and_program_alone_match_engine(tiny_qwen3_dir):
    tokenizer = Tokenizer.from_dir(tiny_qwen3_dir)
    request = fixed_request(tokenizer)
    assert request.tokens == 1024 and request.samples == 4
    assert tuple(tokenizer.encode_packed(list(request.texts), 4096).lengths) == (256,) * 4
    assert fixed_request(tokenizer) == request

    labels = (" yes", " no")
    spec = ScoreSpec(labels=labels, label_token_ids=tokenizer.label_token_ids(labels), max_samples=4,
                     max_tokens_per_sample=256, max_total_tokens=1024)
    engine = eager_engine(tiny_qwen3_dir, spec)
    program = program_alone(engine, request.texts)
    out = program()
    np.testing.assert_allclose(torch.as_tensor(out[0]).numpy(), engine.score(list(request.texts)).scores,
                               atol=1e-6)
    diag = run_diagnostic(engine, request, iterations=1, warmup=0)
    assert diag["tokens"] == 1024 and diag["engine_ms"] > 0 and diag["node_ms"] > 0
    assert set(diag) >= {"engine_qps", "node_qps", "overhead_pct"}
