"""Where the HF peer's W1 time goes on the GPU: bare forward vs the bench's peer wrapper.
Usage: PYTHONPATH=. python3 scripts/peer_check.py MODEL_DIR"""

import sys
import time

import torch
from transformers import AutoModelForCausalLM

from boundgen.bench.peer import HFPeer, peer_call
from boundgen.bench.workloads import get_workload, load_tokenizer, make_requests

model_dir = sys.argv[1]


def timed(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
print("param dtype", next(model.parameters()).dtype, "attn", model.config._attn_implementation)
ids = torch.randint(0, 150000, (15, 250), device="cuda")
mask = torch.ones_like(ids)
mask[:, :100] = 0
with torch.inference_mode():
    print(f"bare forward [15, 250], no mask, logits_to_keep=1: {timed(lambda: model(input_ids=ids, logits_to_keep=1)):.2f} ms")
    print(f"bare forward [15, 250], left-padding mask: {timed(lambda: model(input_ids=ids, attention_mask=mask, logits_to_keep=1)):.2f} ms")
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    print(f"  + position_ids: {timed(lambda: model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1)):.2f} ms")
del model
torch.cuda.empty_cache()
spec = get_workload("W1")
reqs = make_requests(spec, load_tokenizer(model_dir), 8, seed=0)
peer = HFPeer(model_dir)
call = peer_call(peer, spec)
for r in reqs[:2]:
    call(r)
for r in reqs[2:6]:
    res = call(r)
    print("peer W1 request", {k: round(v * 1e3, 2) for k, v in res.timings.items()})
