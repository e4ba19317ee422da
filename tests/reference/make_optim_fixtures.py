#!/usr/bin/env python3
"""make_optim_fixtures.py: reference values for tests/unit/test_optim.c and test_schedule.c.

Writes tests/fixtures/optim/optimizers.json (torch.optim.AdamW / Adam / SGD, foreach=False, 10 steps
on small random tensors with a weight-decay mask expressed as two parameter groups; torch's
clip_grad_norm_) and tests/fixtures/optim/schedules.json (DeepSpeed's WarmupLR, WarmupDecayLR and
WarmupCosineLR: the learning rate each optimizer step actually used, read from the optimizer's
param_groups before optimizer.step(), followed by scheduler.step() as DeepSpeed's engine does).

Floats are written with Python's repr of the float32 (or float64 for learning rates) value, so the
JSON round-trips exactly. Needs torch; the schedule part needs deepspeed (DS_BUILD_OPS=0 pip install
deepspeed). Run from the repository root: python3 tests/reference/make_optim_fixtures.py
"""
import json
import os
import sys

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "optim")
SIZES = [37, 20, 43, 9]   # four "tensors" in one flat buffer
DECAY = [1, 0, 1, 0]      # which of them get weight decay
STEPS = 10


def flat(ts):
    return [float(x) for t in ts for x in t.detach().reshape(-1).tolist()]


def make_tensors(gen):
    params = [torch.randn(n, generator=gen, dtype=torch.float32) for n in SIZES]
    grads = [[torch.randn(n, generator=gen, dtype=torch.float32) * 0.5 for n in SIZES] for _ in range(STEPS)]
    return params, grads


def run_case(name, make_opt, lrs, seed, state_keys):
    gen = torch.Generator().manual_seed(seed)
    init, grads = make_tensors(gen)
    params = [torch.nn.Parameter(t.clone()) for t in init]
    decay = [p for p, d in zip(params, DECAY) if d]
    no_decay = [p for p, d in zip(params, DECAY) if not d]
    opt = make_opt([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}])
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        for p, g in zip(params, grads[step]):
            p.grad = g.clone()
        opt.step()
    case = {
        "name": name,
        "sizes": SIZES,
        "decay": DECAY,
        "lr": lrs,
        "params0": flat(init),
        "grads": [flat(g) for g in grads],
        "params": flat(params),
    }
    for key in state_keys:
        case[key] = flat([opt.state[p][key] for p in params])
    return case


def optimizer_cases():
    lrs = [1e-3 * (1 + 0.1 * s) for s in range(STEPS)]
    cases = []
    c = run_case("adamw", lambda g: torch.optim.AdamW(g, lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                                                      weight_decay=0.1, foreach=False),
                 lrs, 1, ["exp_avg", "exp_avg_sq"])
    c.update(type="AdamW", betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1)
    cases.append(c)
    c = run_case("adam_l2", lambda g: torch.optim.Adam(g, lr=1e-3, betas=(0.8, 0.99), eps=1e-6,
                                                       weight_decay=0.05, foreach=False),
                 lrs, 2, ["exp_avg", "exp_avg_sq"])
    c.update(type="Adam", adam_w_mode=False, betas=[0.8, 0.99], eps=1e-6, weight_decay=0.05)
    cases.append(c)
    sgd_lrs = [0.05 * (1 - 0.05 * s) for s in range(STEPS)]
    for name, mom, damp, nest, wd in [("sgd_plain", 0.0, 0.0, False, 0.01),
                                      ("sgd_momentum", 0.9, 0.1, False, 0.01),
                                      ("sgd_nesterov", 0.9, 0.0, True, 0.02)]:
        keys = ["momentum_buffer"] if mom else []
        c = run_case(name, lambda g: torch.optim.SGD(g, lr=0.05, momentum=mom, dampening=damp, nesterov=nest,
                                                     weight_decay=wd, foreach=False),
                     sgd_lrs, 3, keys)
        c.update(type="SGD", momentum=mom, dampening=damp, nesterov=nest, weight_decay=wd)
        cases.append(c)
    return cases


def clip_cases():
    gen = torch.Generator().manual_seed(4)
    cases = []
    for max_norm in [1.0, 1e3]:
        grads = [torch.randn(n, generator=gen, dtype=torch.float32) for n in SIZES]
        params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
        cases.append({"max_norm": max_norm, "grads": flat(grads), "norm": float(norm),
                      "clipped": flat([p.grad for p in params])})
    return cases


def schedule_cases():
    from deepspeed.runtime import lr_schedules as ls
    configs = [
        ("WarmupLR", {"warmup_min_lr": 0.0, "warmup_max_lr": 0.001, "warmup_num_steps": 10}),
        ("WarmupLR", {"warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 8,
                      "warmup_type": "linear"}),
        ("WarmupLR", {"warmup_num_steps": 1}),  # warmup_max_lr defaults to the optimizer's lr
        ("WarmupDecayLR", {"total_num_steps": 30, "warmup_min_lr": 1e-5, "warmup_max_lr": 6e-4,
                           "warmup_num_steps": 5, "warmup_type": "linear"}),
        ("WarmupDecayLR", {"total_num_steps": 25, "warmup_num_steps": 10}),
        ("WarmupCosineLR", {"total_num_steps": 30, "warmup_min_ratio": 0.1, "warmup_num_steps": 6,
                            "cos_min_ratio": 0.05, "warmup_type": "linear"}),
        ("WarmupCosineLR", {"total_num_steps": 20, "warmup_num_steps": 5}),
    ]
    optimizer_lr = 6e-4
    cases = []
    for typ, params in configs:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=optimizer_lr)
        sched = getattr(ls, typ)(opt, **params)
        lrs = []
        for _ in range(40):
            lrs.append(float(opt.param_groups[0]["lr"]))  # the lr this optimizer step uses
            opt.step()
            sched.step()
        cases.append({"scheduler": {"type": typ, "params": params}, "optimizer_lr": optimizer_lr, "lrs": lrs})
    return cases


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    with open(os.path.join(OUT, "optimizers.json"), "w") as f:
        json.dump({"torch": torch.__version__, "optimizers": optimizer_cases(), "clip": clip_cases()}, f)
        f.write("\n")
    try:
        import deepspeed
    except ImportError:
        print("deepspeed not installed: schedules.json not regenerated", file=sys.stderr)
        return
    with open(os.path.join(OUT, "schedules.json"), "w") as f:
        json.dump({"deepspeed": deepspeed.__version__, "cases": schedule_cases()}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
