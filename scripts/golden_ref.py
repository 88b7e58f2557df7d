"""An independent Mixtral forward written from the *published* tensor names, in plain torch,
used by make_golden.py to check the facts docs/golden.md states about Hugging Face's math
(RoPE convention, attention scaling, GQA head grouping, router softmax over all experts,
top-k renormalisation, SwiGLU with w1 gate / w3 up / w2 down, the load-balancing loss over all
layers concatenated, CE over shifted targets). If HF disagrees with this file, a stated fact
is wrong. Runs in float64 (the exact answer) or float32 (a second fp32 summation order, the
spread a C implementation should expect).
"""
import torch
import torch.nn.functional as F


def forward(W, tokens, c, dtype=torch.float64, grad=False):
    """W: published name -> array/tensor; tokens: [B, T] int64. Returns a dict with logits
    [B, T, V], ce, aux (HF form), aux_layer_mean (the per-layer-averaged variant, for contrast),
    loss, probs (list over layers of [B*T, E]), and the leaf tensors if grad."""
    leaves = {n: torch.as_tensor(w).detach().to(dtype).clone().requires_grad_(grad) for n, w in W.items()}
    t = leaves.__getitem__
    H, Hq, Hkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    D, E, K, L, V = H // Hq, c["num_local_experts"], c["num_experts_per_tok"], c["num_hidden_layers"], c["vocab_size"]
    eps, theta = c["rms_norm_eps"], c["rope_theta"]
    tokens = torch.as_tensor(tokens, dtype=torch.int64)
    B, T = tokens.shape
    N = B * T

    def rms(h, w):  # [.., H] * rsqrt(mean(h^2) + eps) * w
        return h * torch.rsqrt((h * h).mean(-1, keepdim=True) + eps) * w

    # RoPE, "rotate half" (NeoX) convention: pairs are (i, i + D/2), inv_freq_i = theta^(-2i/D)
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=dtype) / D)  # [D/2]
    ang = torch.arange(T, dtype=dtype)[:, None] * inv[None, :]  # [T, D/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)  # [T, D]
    sin = torch.cat([ang.sin(), ang.sin()], -1)

    def rope(x):  # [B, h, T, D]
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    causal = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)  # [T, T]
    x = t("model.embed_tokens.weight")[tokens]  # [B, T, H]
    probs, topis = [], []
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, t(p + "input_layernorm.weight"))
        q = (h @ t(p + "self_attn.q_proj.weight").T).view(B, T, Hq, D).transpose(1, 2)  # [B, Hq, T, D]
        k = (h @ t(p + "self_attn.k_proj.weight").T).view(B, T, Hkv, D).transpose(1, 2)  # [B, Hkv, T, D]
        v = (h @ t(p + "self_attn.v_proj.weight").T).view(B, T, Hkv, D).transpose(1, 2)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(Hq // Hkv, dim=1)  # query head j uses kv head j // (Hq/Hkv)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
        s = q @ k.transpose(-1, -2) * D ** -0.5 + causal  # [B, Hq, T, T]
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, Hq * D)
        x = x + a @ t(p + "self_attn.o_proj.weight").T
        h = rms(x, t(p + "post_attention_layernorm.weight")).reshape(N, H)
        logit = h @ t(p + "block_sparse_moe.gate.weight").T  # [N, E]
        prob = logit.softmax(-1)  # over all E experts
        topv, topi = prob.topk(K, -1)  # [N, K]
        topv = topv / topv.sum(-1, keepdim=True)  # renormalised over the chosen K
        probs.append(prob)
        topis.append(topi)
        out = torch.zeros_like(h)
        for e in range(E):
            q_ = f"{p}block_sparse_moe.experts.{e}."
            y = (F.silu(h @ t(q_ + "w1.weight").T) * (h @ t(q_ + "w3.weight").T)) @ t(q_ + "w2.weight").T
            out = out + (topv * (topi == e)).sum(-1, keepdim=True) * y
        x = x + out.view(B, T, H)
    logits = rms(x, t("model.norm.weight")) @ t("lm_head.weight").T  # [B, T, V]
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))

    # load balancing, HF form: all layers' rows together (L*N rows), f_e = top-k assignments to
    # e / rows (sums to K over e), P_e = mean probability; aux = E * sum_e f_e * P_e
    P = torch.cat(probs)  # [L*N, E]
    f = torch.bincount(torch.cat(topis).reshape(-1), minlength=E).to(dtype) / P.shape[0]
    aux = E * (f * P.mean(0)).sum()
    per = [E * ((torch.bincount(ti.reshape(-1), minlength=E).to(dtype) / N) * pr.mean(0)).sum()
           for pr, ti in zip(probs, topis)]
    aux_layer_mean = torch.stack(per).mean()
    loss = ce + c["router_aux_loss_coef"] * aux
    return dict(logits=logits, ce=ce, aux=aux, aux_layer_mean=aux_layer_mean, loss=loss,
                probs=[pr.detach() for pr in probs], leaves=leaves)


def topk_margin(probs, k):
    """Smallest gap between the k-th and (k+1)-th router probability over all rows: how far
    the routing is from a tie (a tie would let fp32 rounding flip an expert choice)."""
    m = float("inf")
    for pr in probs:
        s = pr.sort(-1, descending=True).values
        m = min(m, float((s[:, k - 1] - s[:, k]).min()))
    return m


def rel_l2(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm().clamp_min(1e-300))
