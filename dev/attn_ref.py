"""attn_ref.py — what PyTorch's own attention kernels reach on this GPU at Mixtral's attention shape
(causal, 32 query heads, 8 kv heads, head dim 128, seq 4096), for each SDPA backend torch offers:
the ceiling our attention kernels are measured against (docs/performance.md). Run on a GPU
machine with torch: python3 dev/attn_ref.py [B ...]. One line per backend and batch:
forward ms and TFLOP/s, forward+backward ms and the backward's TFLOP/s (2.5x the forward's FLOPs),
counted as our bench counts them (causal: half of 4·B·Hq·T²·D)."""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

T, HQ, HKV, D = 4096, 32, 8, 128


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps


def main():
    print("torch", torch.__version__, torch.cuda.get_device_name(), flush=True)
    for B in [int(a) for a in sys.argv[1:]] or [1, 8]:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, HQ, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        k = torch.randn(B, HKV, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        v = torch.randn(B, HKV, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        do = torch.randn(B, HQ, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
        fl = 4.0 * B * HQ * T * T * D / 2
        for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
            try:
                with sdpa_kernel(be):
                    def fwd():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

                    def fb():
                        o = fwd()
                        o.backward(do)

                    tf = timed(fwd, 10)
                    tb = timed(fb, 5) - tf
                print(f"attn_ref {name:9s} B{B} T{T} Hq{HQ} Hkv{HKV} D{D}: fwd {tf:7.3f} ms {fl / tf / 1e9:6.1f} TFLOP/s, "
                      f"bwd {tb:7.3f} ms {2.5 * fl / tb / 1e9:6.1f} TFLOP/s", flush=True)
            except Exception as e:  # a backend that does not take this shape here
                print(f"attn_ref {name:9s} B{B}: unavailable ({repr(e)[:120]})", flush=True)
            q.grad = k.grad = v.grad = None


if __name__ == "__main__":
    main()
