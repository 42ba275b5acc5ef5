# Times GSPN-1's recurrence forward through libcgspn (CGSPN_LIB) at three shapes: python3 gate_recurrent_time.py TAG
import sys, os, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from cgspn_torch import GateRecurrent2dnoindFunction as F
tag = sys.argv[1]
for (N, C, H, W) in [(16, 8, 1024, 1024), (256, 1, 1024, 1024), (64, 96, 56, 56)]:
    ins = [torch.randn(N, C, H, W, device="cuda", dtype=torch.bfloat16) * (0.3 if i >= 2 else 1) for i in range(5)]
    for i in range(2): F.apply(*ins, W)
    ts = []
    for i in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); F.apply(*ins, W); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ms = sorted(ts)[3]; gb = 6 * N * C * H * W * 2 / 1e9
    print(f"{tag} gr fwd {N}x{C}x{H}x{W} bf16 {ms:.3f} ms {gb/ms*1e3:.0f} GB/s", flush=True)
    del ins; torch.cuda.empty_cache()
