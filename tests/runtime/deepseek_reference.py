#!/usr/bin/python3
"""Runs DeepSeek's own reference implementation (inference/model.py of
github.com/deepseek-ai/DeepSeek-V3, MIT licence) on an HF-layout DeepSeek-V2 /
V3 checkpoint directory, such as `msinfer make-model --preset tiny-deepseek-v3`
writes, and prints its logits and greedy tokens as JSON.

The reference is not part of msinfer: it is read from the directory named by
MSINFER_DEEPSEEK_V3_DIR (a checkout of deepseek-ai/DeepSeek-V3; the file used
is <dir>/inference/model.py), by default <repo>/.cache/deepseek-v3. Without it
this script prints why on stderr and exits 77 (ctest's skip code). docs/ENGINE.md
says how to fetch it. Nothing of it is copied here; this file only adapts the
environment around it:

- inference/kernel.py (triton FP8 kernels) is replaced by a shim module
  `kernel` whose weight_dequant is plain torch; act_quant / fp8_gemm are never
  reached (gemm_impl stays "bf16");
- torch.nn.functional.rms_norm (torch >= 2.4) is supplied when missing, computed
  as torch's composite does: normalise in float32, cast to the input dtype,
  multiply by the weight;
- torch < 2.1 has no float8 dtype, so float8_e4m3fn weights are decoded here
  (table of the 256 codes) and dequantised with their weight_scale_inv per
  block exactly as the shim's weight_dequant does (float32 product, stored in
  the default dtype), then loaded into a bf16 model: what the reference
  computes with gemm_impl "bf16" for an fp8 checkpoint;
- HF tensor names are mapped to the reference's as its inference/convert.py does
  (model parallelism 1); the MTP layers (model.layers.<n_layers + j>) are left
  out, as convert.py leaves out layer 61;
- Gate.bias exists in the reference only when dim == 7168 (DeepSeek-V3's
  width); a checkpoint with e_score_correction_bias gets it at any width.

Usage: deepseek_reference.py MODEL_DIR PROMPT_IDS(comma-separated) STEPS [--dtype bf16|float32|engine]
       deepseek_reference.py --gate E K N_GROUP TOPK_GROUP softmax|sigmoid BIAS SCALE TOKENS SEED
       deepseek_reference.py --rope DIM BASE FACTOR ORIGINAL MAX_SEQ BETA_FAST BETA_SLOW START TOKENS HEADS SEED
(the last two: the reference's Gate, or its rotary embedding, alone; see
gate_cases and rope_cases)
--dtype: torch's default dtype while the reference runs (its generate.py uses
bf16; float32 runs the same code on the same weight values in float32).
--dtype engine: float32 with the engine's bf16 roundings (docs/ENGINE.md
"Numerics", as torch_reference.py models them): every Linear's input is rounded
to bf16 (fp32 accumulation), and so is what goes into the latent cache (the
normed latent and the roped shared key); FP8 weights are dequantised to bf16
as in the bf16 run (the engine holds bf16 weights); the absorbed products with kv_b_proj's
halves, softmax and everything else stay float32.
Prints JSON {"tokens": [greedy tokens], "logits": [[vocab floats] per step]}:
step 0 is the logits after the prompt (one prefill call), step i after feeding
token i-1 (one decode call at start_pos = prompt + i - 1, the reference's
absorbed MLA with its latent KV cache).
"""
import importlib.util
import json
import math
import os
import struct
import sys
import types

SKIP = 77


def fail(msg, code=2):
    print("deepseek_reference.py: " + msg, file=sys.stderr)
    sys.exit(code)


def reference_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", ".cache", "deepseek-v3")
    d = os.environ.get("MSINFER_DEEPSEEK_V3_DIR", default)
    if not os.path.isfile(os.path.join(d, "inference", "model.py")):
        fail(
            "DeepSeek's reference implementation not found: no %s/inference/model.py "
            "(set MSINFER_DEEPSEEK_V3_DIR to a checkout of github.com/deepseek-ai/DeepSeek-V3; "
            "docs/ENGINE.md)" % os.path.normpath(d),
            SKIP,
        )
    return d


# The checkout is looked for before torch is imported: a test that skips for
# want of it then costs a Python start, not torch's import (~1.5 s each, over
# dozens of skipped tests a CI pass).
REFERENCE_DIR = reference_dir() if __name__ == "__main__" else None
try:
    import numpy as np
    import torch
except ImportError as e:
    fail("needs /usr/bin/python3 with Debian's python3-torch and python3-numpy (%s)" % e, SKIP)


def e4m3_table():
    """float32 value of each float8_e4m3fn code."""
    t = np.zeros(256, dtype=np.float32)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e, m = (c >> 3) & 0xF, c & 0x7
        if e == 0xF and m == 0x7:
            t[c] = np.nan
        elif e == 0:
            t[c] = s * m / 8.0 * 2.0 ** -6
        else:
            t[c] = s * (1 + m / 8.0) * 2.0 ** (e - 7)
    return t


def load_safetensors(model_dir):
    """name -> (dtype string, float32 torch tensor); F8_E4M3 decoded unscaled."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    table = e4m3_table()
    tensors = {}
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        base = 8 + n
        for key, v in header.items():
            if key == "__metadata__":
                continue
            b, e = v["data_offsets"]
            raw = data[base + b : base + e]
            dt = v["dtype"]
            if dt == "BF16":
                arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif dt == "F16":
                arr = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
            elif dt == "F32":
                arr = np.frombuffer(raw, dtype=np.float32).copy()
            elif dt == "F8_E4M3":
                arr = table[np.frombuffer(raw, dtype=np.uint8)]
            else:
                fail("%s: tensor %s has dtype %s" % (name, key, dt))
            tensors[key] = (dt, torch.from_numpy(arr.reshape(v["shape"]).copy()))
    return tensors


def weight_dequant(x, s, block_size=128):
    """kernel.py's weight_dequant in plain torch: y[i, j] = x[i, j] * s[i // b, j // b]
    in float32, returned in the default dtype (the triton kernel stores into
    torch.empty_like(x, dtype=torch.get_default_dtype()))."""
    M, N = x.shape
    sr, sc = (M + block_size - 1) // block_size, (N + block_size - 1) // block_size
    assert tuple(s.shape) == (sr, sc), "scale shape %s for weight %s" % (tuple(s.shape), (M, N))
    full = s.float().repeat_interleave(block_size, 0)[:M].repeat_interleave(block_size, 1)[:, :N]
    return (x.float() * full).to(torch.get_default_dtype())


def install_shims():
    kernel = types.ModuleType("kernel")
    kernel.weight_dequant = weight_dequant

    def unreachable(*a, **k):
        raise RuntimeError("FP8 GEMM path reached; the harness runs gemm_impl 'bf16'")

    kernel.act_quant = unreachable
    kernel.fp8_gemm = unreachable
    sys.modules["kernel"] = kernel
    F = torch.nn.functional
    if not hasattr(F, "rms_norm"):

        def rms_norm(x, normalized_shape, weight=None, eps=None):
            dims = tuple(range(-len(normalized_shape), 0))
            xf = x.float()
            y = (xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)).type_as(x)
            return y * weight if weight is not None else y

        F.rms_norm = rms_norm


def import_reference(ref_dir):
    install_shims()
    path = os.path.join(ref_dir, "inference", "model.py")
    spec = importlib.util.spec_from_file_location("deepseek_reference_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def model_args(ref, cfg):
    """ModelArgs from an HF config.json; refuses what the reference cannot express."""
    v3 = cfg["architectures"][0] == "DeepseekV3ForCausalLM"
    score = cfg.get("scoring_func", "sigmoid" if v3 else "softmax")
    method = cfg.get("topk_method", "noaux_tc" if v3 else "greedy")
    norm = cfg.get("norm_topk_prob", v3)
    # The reference renormalises the top-K weights for sigmoid and never for
    # softmax; it picks groups by the two best biased scores when the gate has
    # a bias (noaux_tc) and by the best score otherwise.
    if norm != (score == "sigmoid"):
        fail("the reference renormalises iff scoring_func is sigmoid; config has "
             "scoring_func %s, norm_topk_prob %s" % (score, norm))
    if cfg.get("moe_layer_freq", 1) != 1:
        fail("the reference has no moe_layer_freq (config: %s)" % cfg["moe_layer_freq"])
    if cfg.get("rms_norm_eps", 1e-6) != 1e-6:
        fail("the reference's RMSNorm eps is 1e-6 (config: %s)" % cfg["rms_norm_eps"])
    if cfg.get("n_group", 1) > 1 and method == "greedy":
        fail("topk_method greedy with n_group > 1: the reference would limit groups")
    max_seq = int(cfg.get("max_position_embeddings", 4096))
    rs = cfg.get("rope_scaling")
    kw = dict(
        max_batch_size=1,
        max_seq_len=max_seq,
        dtype="bf16",
        vocab_size=cfg["vocab_size"],
        dim=cfg["hidden_size"],
        inter_dim=cfg.get("intermediate_size", 1),
        moe_inter_dim=cfg["moe_intermediate_size"],
        n_layers=cfg["num_hidden_layers"],
        n_dense_layers=cfg.get("first_k_dense_replace", 0),
        n_heads=cfg["num_attention_heads"],
        n_routed_experts=cfg["n_routed_experts"],
        n_shared_experts=cfg.get("n_shared_experts", 0),
        n_activated_experts=cfg["num_experts_per_tok"],
        n_expert_groups=cfg.get("n_group", 1),
        n_limited_groups=cfg.get("topk_group", 1),
        score_func=score,
        route_scale=cfg.get("routed_scaling_factor", 1.0),
        q_lora_rank=cfg.get("q_lora_rank") or 0,
        kv_lora_rank=cfg["kv_lora_rank"],
        qk_nope_head_dim=cfg["qk_nope_head_dim"],
        qk_rope_head_dim=cfg["qk_rope_head_dim"],
        v_head_dim=cfg["v_head_dim"],
        rope_theta=cfg.get("rope_theta", 10000.0),
    )
    if rs:
        if rs.get("type", rs.get("rope_type")) != "yarn":
            fail("rope_scaling type %s: the reference implements yarn" % rs.get("type"))
        m, m_all = rs.get("mscale", 1.0), rs.get("mscale_all_dim", 0)
        if m != m_all:
            fail("the reference has one mscale; config has mscale %s, mscale_all_dim %s" % (m, m_all))
        if max_seq <= rs["original_max_position_embeddings"]:
            fail("YaRN is active in the reference only when max_position_embeddings (%d) > "
                 "original_max_position_embeddings" % max_seq)
        kw.update(
            original_seq_len=rs["original_max_position_embeddings"],
            rope_factor=rs["factor"],
            beta_fast=rs.get("beta_fast", 32),
            beta_slow=rs.get("beta_slow", 1),
            mscale=m,
        )
    else:
        kw.update(original_seq_len=max_seq)  # no YaRN
    return ref.ModelArgs(**kw)


# inference/convert.py's table: HF name component -> reference name component.
MAPPING = {
    "embed_tokens": "embed",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "q_proj": "wq",
    "q_a_proj": "wq_a",
    "q_a_layernorm": "q_norm",
    "q_b_proj": "wq_b",
    "kv_a_proj_with_mqa": "wkv_a",
    "kv_a_layernorm": "kv_norm",
    "kv_b_proj": "wkv_b",
    "o_proj": "wo",
    "gate": "gate",
    "gate_proj": "w1",
    "down_proj": "w2",
    "up_proj": "w3",
    "norm": "norm",
    "lm_head": "head",
}


def reference_state_dict(tensors, cfg, round_dequant=False):
    """HF checkpoint -> the reference's names, FP8 weights dequantised (and then
    rounded to bf16 with round_dequant, as the reference's bf16 run stores them)."""
    n_layers = cfg["num_hidden_layers"]
    qc = cfg.get("quantization_config")
    block = qc["weight_block_size"] if qc else None
    if block is not None and block[0] != block[1]:
        fail("the reference's weight_dequant takes square blocks (config: %s)" % block)
    out = {}
    for name, (dt, t) in tensors.items():
        if name.endswith("weight_scale_inv"):
            continue
        parts = name.split(".")
        if name.startswith("model.layers.") and int(parts[2]) >= n_layers:
            continue  # an MTP module (convert.py skips model.layers.61)
        if dt == "F8_E4M3":
            if block is None:
                fail("%s is F8_E4M3 but config.json has no quantization_config" % name)
            scale = tensors.get(name + "_scale_inv")
            if scale is None:
                fail("%s has no %s_scale_inv" % (name, name))
            t = weight_dequant(t, scale[1], block[0])
            if round_dequant:
                t = bf(t)
        r = name[len("model."):] if name.startswith("model.") else name
        r = r.replace("self_attn", "attn").replace("mlp", "ffn")
        r = r.replace("e_score_correction_bias", "bias")
        key = r.split(".")[-2]
        if key not in MAPPING:
            fail("tensor %s: no mapping for %s" % (name, key))
        r = r.replace(key, MAPPING[key])
        out[r] = t
    return out


def gate_cases(argv):
    """--gate E K N_GROUP TOPK_GROUP softmax|sigmoid BIAS(0|1) SCALE TOKENS SEED: the
    reference's Gate alone, in float32, on seeded random router logits (its
    weight is the identity, so the logits are the input rows), for the
    engine's routing kernel to be compared with."""
    E, K, G, TG = (int(v) for v in argv[:4])
    score, has_bias, scale, T, seed = argv[4], argv[5] == "1", float(argv[6]), int(argv[7]), int(argv[8])
    ref = import_reference(REFERENCE_DIR)
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(seed)
    args = ref.ModelArgs(dim=E, n_routed_experts=E, n_activated_experts=K, n_expert_groups=G,
                         n_limited_groups=TG, score_func=score, route_scale=scale)
    gate = ref.Gate(args)
    gate.weight = torch.nn.Parameter(torch.eye(E))
    bias = torch.randn(E) * 0.3
    gate.bias = torch.nn.Parameter(bias.clone()) if has_bias else None
    logits = torch.randn(T, E) * 2
    with torch.no_grad():
        weights, experts = gate(logits)
    print(json.dumps({"bias": bias.tolist() if has_bias else None, "logits": logits.tolist(),
                      "experts": experts.tolist(), "weights": weights.tolist()}))


def rope_cases(argv):
    """--rope DIM BASE FACTOR ORIGINAL MAX_SEQ BETA_FAST BETA_SLOW START TOKENS HEADS SEED:
    the reference's precompute_freqs_cis and apply_rotary_emb alone, in float32,
    on seeded random rows x [TOKENS, HEADS, DIM] at positions START.. (YaRN is
    active in the reference when MAX_SEQ > ORIGINAL)."""
    dim, base, factor, orig, max_seq = int(argv[0]), float(argv[1]), float(argv[2]), int(argv[3]), int(argv[4])
    beta_fast, beta_slow, start, T, H, seed = (float(argv[5]), float(argv[6]), int(argv[7]),
                                               int(argv[8]), int(argv[9]), int(argv[10]))
    ref = import_reference(REFERENCE_DIR)
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(seed)
    args = ref.ModelArgs(qk_rope_head_dim=dim, max_seq_len=max_seq, rope_theta=base, rope_factor=factor,
                         original_seq_len=orig, beta_fast=beta_fast, beta_slow=beta_slow)
    freqs_cis = ref.precompute_freqs_cis(args)
    x = torch.randn(1, T, H, dim)
    y = ref.apply_rotary_emb(x, freqs_cis[start : start + T])
    print(json.dumps({"x": x[0].flatten().tolist(), "y": y[0].flatten().tolist()}))


def bf(x):
    """Round to bf16 and back (what a bf16 GEMM input or cache entry holds)."""
    return x.to(torch.bfloat16).to(x.dtype)


def install_engine_rounding(ref, model, args):
    """--dtype engine: bf16 GEMM inputs and a bf16 latent cache (see the usage)."""
    plain_linear = ref.linear

    def linear(x, weight, *rest, **kw):
        return plain_linear(bf(x), weight, *rest, **kw)

    ref.linear = linear  # Linear.forward and Gate.forward look it up in the module
    if args.n_heads < 2:
        fail("--dtype engine tells the roped key from q by its single head; n_heads is 1")
    plain_rope = ref.apply_rotary_emb

    def apply_rotary_emb(x, freqs_cis):
        y = plain_rope(x, freqs_cis)
        return bf(y) if x.size(2) == 1 else y  # k_pe [b, s, 1, rope] goes to the cache

    ref.apply_rotary_emb = apply_rotary_emb
    for layer in model.layers:
        # In the absorbed MLA, kv_norm's output is exactly what the cache stores.
        layer.attn.kv_norm.register_forward_hook(lambda m, i, o: bf(o))


def main():
    argv = sys.argv[1:]
    if argv == ["--check"]:  # exit 0: it can run here (77 and why: it cannot)
        return
    if argv[:1] == ["--gate"]:
        return gate_cases(argv[1:])
    if argv[:1] == ["--rope"]:
        return rope_cases(argv[1:])
    dtype = torch.bfloat16
    engine_rounding = False
    if "--dtype" in argv:
        i = argv.index("--dtype")
        engine_rounding = argv[i + 1] == "engine"
        dtype = {"bf16": torch.bfloat16, "float32": torch.float32, "engine": torch.float32}[argv[i + 1]]
        del argv[i : i + 2]
    if len(argv) != 3:
        fail("usage: deepseek_reference.py MODEL_DIR PROMPT_IDS STEPS [--dtype bf16|float32|engine]")
    model_dir, prompt, steps = argv[0], argv[1], int(argv[2])
    ref = import_reference(REFERENCE_DIR)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    tensors = load_safetensors(model_dir)
    args = model_args(ref, cfg)
    with torch.no_grad():
        sd = reference_state_dict(tensors, cfg, round_dequant=engine_rounding)
        model = ref.Transformer(args)
        if dtype == torch.float32:
            model = model.float()  # Linear.dtype is bf16 for ModelArgs.dtype "bf16"
        # Gate.bias: only for dim 7168 in the reference; any width here.
        for i, layer in enumerate(model.layers):
            key = "layers.%d.ffn.gate.bias" % i
            if key in sd and getattr(layer.ffn, "gate", None) is not None and layer.ffn.gate.bias is None:
                layer.ffn.gate.bias = torch.nn.Parameter(torch.empty(sd[key].shape, dtype=torch.float32))
        own = model.state_dict()
        missing = sorted(set(own) - set(sd))
        extra = sorted(set(sd) - set(own))
        if missing or extra:
            fail("checkpoint does not match the reference model: missing %s, unexpected %s"
                 % (missing[:8], extra[:8]))
        for k, v in sd.items():
            if tuple(own[k].shape) != tuple(v.shape):
                fail("tensor %s: checkpoint %s, reference %s" % (k, tuple(v.shape), tuple(own[k].shape)))
            own[k].copy_(v.to(own[k].dtype))
    if engine_rounding:
        install_engine_rounding(ref, model, args)
    ids = [int(t) for t in prompt.split(",")]
    if len(ids) + steps > args.max_seq_len:
        fail("prompt + steps exceed max_position_embeddings %d" % args.max_seq_len)
    tokens, all_logits = [], []
    logits = model.forward(torch.tensor([ids]), 0)[0]
    pos = len(ids)
    for s in range(steps):
        all_logits.append([float(v) for v in logits.float()])
        t = int(torch.argmax(logits))
        tokens.append(t)
        if s + 1 < steps:
            logits = model.forward(torch.tensor([[t]]), pos)[0]
            pos += 1
    print(json.dumps({"tokens": tokens, "logits": all_logits}))


if __name__ == "__main__":
    main()
