#!/usr/bin/env python3
"""make_adam8_fixtures.py: reference values for the 8-bit AdamW tests (tests/unit/test_adam8.c).

Runs bitsandbytes.optim.AdamW8bit (bitsandbytes 0.50, its CPU kernels) for 20 steps on five CPU
tensors with fixed gradients, and writes

  tests/fixtures/optim/adam8.safetensors   maps, initial parameters, the gradients, parameters after
                                           steps 1 and 20, and the quantised state after steps 1 and 20
  tests/fixtures/optim/adam8.json          sizes, decay groups, learning rates, hyperparameters

Tensors of 4096 elements or more get 8-bit state (blockwise, 256 elements a block, the signed dynamic
map for exp_avg and the unsigned one for exp_avg_sq); smaller ones keep 32-bit state
(min_8bit_size = 4096, bitsandbytes' default). Weight decay is expressed as two parameter groups, as
shardlm's decay mask does. Step t uses gradient set t % 4. The state tensors are concatenations over
the tensors in order: state1 / state2 (uint8) and absmax1 / absmax2 of the 8-bit tensors, and
exp_avg / exp_avg_sq (float32) of the 32-bit ones.

Needs torch, bitsandbytes and safetensors. Run from the repository root:
  python3 tests/reference/make_adam8_fixtures.py
"""
import json
import os

import bitsandbytes as bnb
import bitsandbytes.functional as F
import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "optim")
SIZES = [4500, 300, 4096, 700, 5000]   # 8-bit, 32-bit, 8-bit (16 whole blocks), 32-bit, 8-bit
DECAY = [1, 0, 0, 1, 1]
STEPS = 20
GRAD_SETS = 4
LR = [1e-3 * (1 + 0.05 * s) for s in range(STEPS)]
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01


def main():
    gen = torch.Generator().manual_seed(8)
    init = [torch.randn(n, generator=gen) for n in SIZES]
    # gradients with a spread of magnitudes inside each block, so the dynamic map's range is used
    grads = [[torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 2 * (0.1 + i) for i, n in
              enumerate(SIZES)] for _ in range(GRAD_SETS)]
    params = [torch.nn.Parameter(t.clone()) for t in init]
    decay = [p for p, d in zip(params, DECAY) if d]
    no_decay = [p for p, d in zip(params, DECAY) if not d]
    opt = bnb.optim.AdamW8bit([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=LR[0],
                              betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    out = {
        "map_signed": F.create_dynamic_map(signed=True),
        "map_unsigned": F.create_dynamic_map(signed=False),
        "params0": torch.cat(init),
    }
    for k in range(GRAD_SETS):
        out[f"grads{k}"] = torch.cat(grads[k])

    def snapshot(tag):
        out[f"params{tag}"] = torch.cat([p.detach().clone() for p in params])
        eight = [p for p in params if opt.state[p]["state1"].dtype == torch.uint8]
        full = [p for p in params if opt.state[p]["state1"].dtype == torch.float32]
        for key in ["state1", "state2", "absmax1", "absmax2"]:
            out[f"{key}_{tag}"] = torch.cat([opt.state[p][key].clone() for p in eight])
        out[f"exp_avg_{tag}"] = torch.cat([opt.state[p]["state1"].clone() for p in full])
        out[f"exp_avg_sq_{tag}"] = torch.cat([opt.state[p]["state2"].clone() for p in full])

    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = LR[step]
        for p, g in zip(params, grads[step % GRAD_SETS]):
            p.grad = g.clone()
        opt.step()
        if step == 0:
            snapshot("1")
    snapshot(str(STEPS))

    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, "adam8.safetensors"))
    meta = {"bitsandbytes": bnb.__version__, "torch": torch.__version__, "sizes": SIZES, "decay": DECAY,
            "steps": STEPS, "grad_sets": GRAD_SETS, "lr": LR, "betas": list(BETAS), "eps": EPS,
            "weight_decay": WEIGHT_DECAY, "min_8bit_size": 4096, "blocksize": 256}
    with open(os.path.join(OUT, "adam8.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
