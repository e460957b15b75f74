#!/usr/bin/python3
"""Runs OpenAI's own reference implementation of gpt-oss (gpt_oss/torch/model.py
and gpt_oss/torch/weights.py of github.com/openai/gpt-oss, Apache-2.0) on an
HF-layout GptOssForCausalLM checkpoint directory, such as `msinfer make-model
--preset tiny-gpt-oss` writes, and prints its logits and greedy tokens as JSON.

The reference is not part of msinfer: it is read from the directory named by
MSINFER_GPT_OSS_DIR (a checkout of openai/gpt-oss, or a copy of its
gpt_oss/torch/ files under <dir>/gpt_oss/torch/), by default
<repo>/.cache/gpt-oss. Without it this script prints why on stderr and exits 77
(ctest's skip code); docs/ENGINE.md says how to fetch it. Nothing of it is
copied here; this file only adapts the environment around it:

- weights.py opens the checkpoint with safetensors' safe_open, which Debian
  does not package: a module `safetensors` is supplied whose safe_open reads
  the HF checkpoint and presents it under the reference's own tensor names
  (the HF names mapped back as OpenAI's checkpoints name them: q/k/v_proj
  stacked into attn.qkv, mlp.experts.gate_up_proj_* -> mlp.mlp1_weight.*,
  down_proj_* -> mlp2_weight.*, router -> gate, ...). The MXFP4 blocks and
  scales reach the reference as stored; its own Checkpoint.get decodes them.
- The model is built with the reference's ModelConfig from config.json's
  fields (its from_checkpoint reads OpenAI's original config.json names) and
  its parameters are filled as from_checkpoint fills them (one rank).
- The reference hardcodes what HF's config makes fields: sliding layers are
  the even ones, RMSNorm eps 1e-5, YaRN's correction range unrounded
  (truncate false), biases on the attention; configs that differ are refused.

Usage: gpt_oss_reference.py MODEL_DIR PROMPT_IDS(comma-separated) STEPS [--dtype bf16|float32|engine]
--dtype bf16: the reference as it runs (bf16 parameters and activations).
float32: the same code on the same values in float32.
engine: float32 with the engine's bf16 roundings (docs/ENGINE.md "Numerics"):
every GEMM input is rounded to bf16 (the Linears' and the experts' einsums'),
and so are the keys (after RoPE) and values, which the engine's KV cache holds
in bf16; a Linear's bias is added after its product, as the engine adds it
(addmm would start the sum from it); norms, RoPE, softmax (with the sinks),
SwiGLU, the residual and the expert combine stay float32.
Prints JSON {"tokens": [greedy tokens], "logits": [[vocab floats] per step]}:
step 0 is the logits after the prompt, step i after appending token i - 1
(the reference has no KV cache: each step runs the whole sequence).
"""
import importlib
import json
import os
import struct
import sys
import types

SKIP = 77


def fail(msg, code=2):
    print("gpt_oss_reference.py: " + msg, file=sys.stderr)
    sys.exit(code)


def reference_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", ".cache", "gpt-oss")
    d = os.environ.get("MSINFER_GPT_OSS_DIR", default)
    for f in ("model.py", "weights.py"):
        if not os.path.isfile(os.path.join(d, "gpt_oss", "torch", f)):
            fail(
                "OpenAI's gpt-oss reference implementation not found: no %s/gpt_oss/torch/%s "
                "(set MSINFER_GPT_OSS_DIR to a checkout of github.com/openai/gpt-oss; "
                "docs/ENGINE.md)" % (os.path.normpath(d), f),
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


def read_safetensors(model_dir):
    """HF name -> torch tensor as stored (BF16 as bfloat16, U8 as uint8)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
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
                t = torch.from_numpy(arr.reshape(v["shape"]).copy()).to(torch.bfloat16)
            elif dt == "F16":
                t = torch.from_numpy(np.frombuffer(raw, dtype=np.float16).reshape(v["shape"]).copy())
            elif dt == "F32":
                t = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).reshape(v["shape"]).copy())
            elif dt == "U8":
                t = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).reshape(v["shape"]).copy())
            else:
                fail("%s: tensor %s has dtype %s" % (name, key, dt))
            tensors[key] = t
    return tensors


def reference_names(hf, n_layers):
    """The reference's checkpoint name -> a function giving the tensor from the HF ones."""
    out = {
        "embedding.weight": lambda: hf["model.embed_tokens.weight"],
        "norm.scale": lambda: hf["model.norm.weight"],
        "unembedding.weight": lambda: hf["lm_head.weight"],
    }
    for i in range(n_layers):
        p, r = "model.layers.%d." % i, "block.%d." % i
        a = p + "self_attn."

        def qkv(kind, a=a):
            return lambda: torch.cat([hf[a + m + "_proj." + kind] for m in "qkv"], dim=0)

        out.update({
            r + "attn.norm.scale": (lambda p=p: hf[p + "input_layernorm.weight"]),
            r + "attn.qkv.weight": qkv("weight"),
            r + "attn.qkv.bias": qkv("bias"),
            r + "attn.sinks": (lambda a=a: hf[a + "sinks"]),
            r + "attn.out.weight": (lambda a=a: hf[a + "o_proj.weight"]),
            r + "attn.out.bias": (lambda a=a: hf[a + "o_proj.bias"]),
            r + "mlp.norm.scale": (lambda p=p: hf[p + "post_attention_layernorm.weight"]),
            r + "mlp.gate.weight": (lambda p=p: hf[p + "mlp.router.weight"]),
            r + "mlp.gate.bias": (lambda p=p: hf[p + "mlp.router.bias"]),
        })
        for ref, name in (("mlp1", "gate_up_proj"), ("mlp2", "down_proj")):
            x = p + "mlp.experts." + name
            out[r + "mlp.%s_weight.blocks" % ref] = (lambda x=x: hf[x + "_blocks"])
            out[r + "mlp.%s_weight.scales" % ref] = (lambda x=x: hf[x + "_scales"])
            out[r + "mlp.%s_bias" % ref] = (lambda x=x: hf[x + "_bias"])
    return out


def install_safetensors_shim(model_dir, n_layers):
    """A `safetensors` module for weights.py: safe_open over the HF checkpoint,
    answering with the reference's names (every name from the first file)."""
    hf = read_safetensors(model_dir)
    names = reference_names(hf, n_layers)
    used = set()
    first = [None]

    class Handle:
        def __init__(self, path):
            self.path = path

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def keys(self):
            if first[0] is None:
                first[0] = self.path
            return list(names) if self.path == first[0] else []

        def get_tensor(self, name):
            t = names[name]()
            used.add(name)
            return t

    def safe_open(path, framework="pt", device="cpu"):
        return Handle(path)

    mod = types.ModuleType("safetensors")
    mod.safe_open = safe_open
    sys.modules["safetensors"] = mod
    # Every HF tensor must have a place in the reference model.
    mapped = set()
    for i in range(n_layers):
        p = "model.layers.%d." % i
        for m in "qkvo":
            mapped |= {p + "self_attn.%s_proj.weight" % m, p + "self_attn.%s_proj.bias" % m}
        mapped |= {p + "self_attn.sinks", p + "input_layernorm.weight",
                   p + "post_attention_layernorm.weight", p + "mlp.router.weight",
                   p + "mlp.router.bias"}
        for n in ("gate_up_proj", "down_proj"):
            mapped |= {p + "mlp.experts." + n + s for s in ("_blocks", "_scales", "_bias")}
    mapped |= {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    extra = sorted(set(hf) - mapped)
    if extra:
        fail("checkpoint tensors the reference has no place for: %s" % extra[:8])
    return used


def reference_config(ref, cfg):
    """The reference's ModelConfig from an HF config.json; refuses what it cannot express."""
    L = cfg["num_hidden_layers"]
    want = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)]
    if cfg.get("layer_types", want) != want:
        fail("the reference slides the even layers only; config has layer_types %s" % cfg["layer_types"])
    if cfg.get("rms_norm_eps", 1e-5) != 1e-5:
        fail("the reference's RMSNorm eps is 1e-5 (config: %s)" % cfg["rms_norm_eps"])
    if not cfg.get("attention_bias", True):
        fail("the reference's attention has biases (config: attention_bias false)")
    if cfg.get("tie_word_embeddings", False):
        fail("the reference has its own unembedding (config: tie_word_embeddings true)")
    q = cfg.get("quantization_config") or {}
    if q.get("quant_method") != "mxfp4":
        fail("the reference reads the experts as MXFP4 (config: quantization_config %s)" % q)
    kw = dict(
        num_hidden_layers=L,
        num_experts=cfg["num_local_experts"],
        experts_per_token=cfg["num_experts_per_tok"],
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        swiglu_limit=cfg.get("swiglu_limit", 7.0),
        head_dim=cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]),
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        sliding_window=cfg.get("sliding_window", 128),
        rope_theta=cfg.get("rope_theta", 150000.0),
    )
    rs = cfg.get("rope_scaling")
    if rs:
        if rs.get("rope_type", rs.get("type")) != "yarn":
            fail("rope_scaling %s: the reference implements yarn" % rs)
        if rs.get("truncate", True):
            fail("the reference does not round YaRN's correction range (config needs truncate false)")
        for k in ("attention_factor", "mscale", "mscale_all_dim"):
            if k in rs:
                fail("the reference's YaRN concentration is fixed; config has rope_scaling.%s" % k)
        kw.update(
            initial_context_length=rs["original_max_position_embeddings"],
            rope_scaling_factor=float(rs["factor"]),
            rope_ntk_alpha=float(rs.get("beta_slow", 1.0)),
            rope_ntk_beta=float(rs.get("beta_fast", 32.0)),
        )
    else:
        kw.update(rope_scaling_factor=1.0)
    return ref.ModelConfig(**kw)


def bf(x):
    """Round to bf16 and back (what a bf16 GEMM input or cache entry holds)."""
    return x.to(torch.bfloat16).to(x.dtype)


class EngineTorch:
    """`torch` as the reference module sees it under --dtype engine: the
    experts' two einsums (MLPBlock.forward) get their activations rounded to
    bf16, as the engine's GEMMs round their inputs; all else is torch."""

    EXPERT_EINSUMS = ("beck,bk->bec", "beck,bek->bec")

    def __getattr__(self, name):
        return getattr(torch, name)

    def einsum(self, eq, *ops):
        if eq in self.EXPERT_EINSUMS:
            ops = (ops[0], bf(ops[1]))
        return torch.einsum(eq, *ops)


def install_engine_rounding(mod, model):
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):  # qkv, out, gate, unembedding

            def forward(x, m=m):
                # The engine's GEMM sums the products (bf16 input) first and adds
                # the bias after, in float32; torch's addmm would start from it.
                y = torch.nn.functional.linear(bf(x), m.weight)
                return y + m.bias if m.bias is not None else y

            m.forward = forward
    plain_sdpa = mod.sdpa

    def sdpa(Q, K, V, S, sm_scale, sliding_window=0):
        return plain_sdpa(Q, bf(K), bf(V), S, sm_scale, sliding_window)  # the bf16 KV cache

    mod.sdpa = sdpa
    mod.torch = EngineTorch()


def main():
    argv = sys.argv[1:]
    if argv == ["--check"]:  # exit 0: it can run here (77 and why: it cannot)
        return
    dtype, engine = "bf16", False
    if "--dtype" in argv:
        i = argv.index("--dtype")
        dtype = argv[i + 1]
        if dtype not in ("bf16", "float32", "engine"):
            fail("--dtype must be bf16, float32 or engine")
        engine = dtype == "engine"
        del argv[i : i + 2]
    if len(argv) != 3:
        fail("usage: gpt_oss_reference.py MODEL_DIR PROMPT_IDS STEPS [--dtype bf16|float32|engine]")
    model_dir, prompt, steps = argv[0], argv[1], int(argv[2])
    root = REFERENCE_DIR
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    used = install_safetensors_shim(model_dir, cfg["num_hidden_layers"])
    sys.path.insert(0, root)
    mod = importlib.import_module("gpt_oss.torch.model")
    weights = importlib.import_module("gpt_oss.torch.weights")
    torch.set_num_threads(1)
    config = reference_config(mod, cfg)
    device = torch.device("cpu")
    with torch.no_grad():
        model = mod.Transformer(config=config, device=device)
        model.eval()
        checkpoint = weights.Checkpoint(model_dir, device)
        for name, param in model.named_parameters():  # as Transformer.from_checkpoint, one rank
            loaded = checkpoint.get(name)
            if tuple(loaded.shape) != tuple(param.shape):
                fail("tensor %s: checkpoint %s, reference %s"
                     % (name, tuple(loaded.shape), tuple(param.shape)))
            param.data.copy_(loaded)
        if dtype != "bf16":
            model = model.float()
    if engine:
        install_engine_rounding(mod, model)
    ids = [int(t) for t in prompt.split(",")]
    tokens, all_logits = [], []
    seq = list(ids)
    with torch.no_grad():
        for s in range(steps):
            logits = model(torch.as_tensor(seq, dtype=torch.int32))[-1]
            all_logits.append([float(v) for v in logits.float()])
            t = int(torch.argmax(logits))
            tokens.append(t)
            seq.append(t)
    print(json.dumps({"tokens": tokens, "logits": all_logits}))


if __name__ == "__main__":
    main()
