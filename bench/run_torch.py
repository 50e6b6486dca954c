# From /work/shared/bench/run_torch.py (the reference harness); adapted for onnxtrain's bench/.
"""PyTorch eager CPU training (torch.optim.AdamW, the same hyper-parameters as the ONNX sides).

    python run_torch.py --workload NAME [--steps N] [--warmup W] [--threads T]
"""

from common import ADAMW, make_batch, peak_rss_mb, run


def setup(args, rec):
    import torch
    import torch.nn.functional as F

    import workloads

    torch.set_num_threads(args.threads)
    rec.update(torch_version=torch.__version__, gen_seconds=0.0, rss_after_import_mb=peak_rss_mb())
    model = workloads.build(args.workload)
    train_mode = model.training  # False for the frozen-backbone workload (BN on running stats)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **ADAMW)
    x, y = (torch.from_numpy(a) for a in make_batch(args.workload))

    def train_step():
        model.train(train_mode)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    def eval_step():
        model.eval()
        with torch.no_grad():
            return F.cross_entropy(model(x), y).item()

    return train_step, eval_step


if __name__ == "__main__":
    run("torch", setup)
