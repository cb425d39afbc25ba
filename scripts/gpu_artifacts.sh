# Sourced by scripts/gpu_served.sh: the W1 and W2/W3 artifacts it builds, in one place, so that every
# run builds the same ones. `boundgen build CHECKPOINT "${W1_ARGS[@]}" --out DIR $W1_DEFAULT`.
# W1 bounds hold four 15-sample requests per call, so that concurrent requests can be batched.
W1_ARGS=(--task score --labels " yes" " no" --max-samples 60 --max-tokens-per-sample 256 --max-total-tokens 15360
         --cuda-graphs --batching --token-bucket 128 --contexts 2 --device cuda --dtype bfloat16 --name w1)
# (token bucket 128: 188.0 against 176.5 QPS within the budget for 512, 2026-12-01: less padding a call)
# Triton norms and RoPE +8%; then fused q/k-norm + RoPE and residual add + norm: 191.0 against 186.0 QPS,
# 294 against 450 kernels a request (2026-12-01, docs/benchmarks.md).
# The MLP in FP8 (--fp8 mlp, gated against the FP32 program at build) with its quantizations fused into the
# SwiGLU and norm kernels (silu_quant, add_rmsnorm_quant): 228.0 against 216.0 (FP8, Inductor's quantizations)
# and 201.0 (bf16) QPS within the budget in one run with the peers (2026-12-01, 0e668eb, docs/benchmarks.md).
# Packed attention with a K/V head's query heads in one program (triton_gqa): 220.5 against 213.5 QPS served,
# 219.5 against 211.5 in process (2026-12-02, 0285589, docs/benchmarks.md).
W1_DEFAULT="${W1_DEFAULT:---lowering packed_attention=triton_gqa --lowering rmsnorm=triton --lowering rope=triton \
--lowering qk_norm_rope=triton --lowering add_rmsnorm=triton --fp8 mlp --lowering silu_quant=triton \
--lowering add_rmsnorm_quant=triton}"  # W1_DEFAULT set: a run's own
# One beam artifact serves W2 and W3: W=100, N_gen=5, prompts up to 400 tokens, up to 8 a call; candidate
# selection by chunks; RoPE and the K/V write in one kernel a decode layer: 235.0 against 213.5 W2 and 159.5
# against 136.5 W3 QPS within the budget; cos / sin once a step (cos_sin=triton): 240.5 against 232.5 W2, 172.0
# against 159.5 W3, 246 against 250 launches a step (all measured 2026-12-01: docs/benchmarks.md). One context
# whose calls wait up to 5 ms for their clients (--contexts 1 --batch-wait-ms 5): 386.0 against 240.0 W2 and
# 250.0 against 147.5 W3 in one run with the peers (2026-12-01, 8adefbe); two contexts with the wait 292.0 / 203.0.
# The wait learned from how long the clients took to come back (--batch-wait-learned, never under the 5 ms): served
# on an H100 host whose clients came back in ~5 ms, 3.81-3.95 against 2.93-3.61 requests a call of 4 and W2 c=4
# means 2.8-4.7 ms lower, in each of four pairings (2026-12-06, 4497945; docs/benchmarks.md).
BEAM_ARGS=(--task beam --width 100 --steps 5 --min-new-tokens 5 --max-prompt-tokens 400 --device cuda
           --dtype bfloat16 --name beam)
BEAM_DEFAULT="--lowering packed_attention=triton --lowering prefix_attention=triton --lowering vocab_topk=chunks \
--lowering rope_kv_write=triton --lowering cos_sin=triton --max-requests 8 --cuda-graphs \
--batching --contexts 1 --batch-wait-ms 5 --batch-wait-learned --token-bucket 128"
