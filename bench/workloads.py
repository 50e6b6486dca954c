# From /work/shared/bench/workloads.py (the reference harness); bert_small and resnet18 added (issue 14).
"""Fixed, deterministic benchmark workloads: torch definitions, ONNX export, FLOP counts.

    python workloads.py export NAME OUT.onnx   # export one workload
    python workloads.py flops                  # print forward MACs / training-step FLOPs as JSON lines
"""
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import SPECS, make_batch


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def conv_bn(cin, cout, k, stride=1, groups=1, act=True):
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        layers = [conv_bn(cin, hidden, 1)] if expand != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), conv_bn(hidden, cout, 1, act=False)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (width 1.0), without the classifier dropout (kept deterministic)."""
    CONFIG = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, classes):
        super().__init__()
        layers, c = [conv_bn(3, 32, 3, 2)], 32
        for t, cout, n, s in self.CONFIG:
            for i in range(n):
                layers.append(InvertedResidual(c, cout, s if i == 0 else 1, t))
                c = cout
        layers.append(conv_bn(c, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(1280, classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class SelfAttention(nn.Module):
    """Hand-written multi-head attention so the export is plain MatMul/Softmax/Reshape/Transpose."""

    def __init__(self, d, heads, seq):
        super().__init__()
        self.d, self.heads, self.seq = d, heads, seq
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        dh = self.d // self.heads
        split = lambda t: t.reshape(-1, self.seq, self.heads, dh).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        a = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(dh)), dim=-1)
        return self.o(torch.matmul(a, v).transpose(1, 2).reshape(-1, self.seq, self.d))


class EncoderLayer(nn.Module):  # post-LN, as BERT
    def __init__(self, d, heads, ffn, seq):
        super().__init__()
        self.attn, self.ln1 = SelfAttention(d, heads, seq), nn.LayerNorm(d)
        self.ff1, self.ff2, self.ln2 = nn.Linear(d, ffn), nn.Linear(ffn, d), nn.LayerNorm(d)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class TinyBert(nn.Module):
    def __init__(self, vocab=1000, seq=64, d=128, layers=2, heads=4, ffn=512, classes=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        nn.init.normal_(self.tok.weight, 0, 0.02)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.Sequential(*(EncoderLayer(d, heads, ffn, seq) for _ in range(layers)))
        self.head = nn.Linear(d, classes)

    def forward(self, ids):
        return self.head(self.layers(self.ln(self.tok(ids) + self.pos)).mean(dim=1))


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                  nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = conv_bn(cin, cout, 1, stride, act=False) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.conv(x) + self.down(x))


class ResNet18(nn.Module):
    """torchvision's resnet18 (random weights), with the classifier named ``classifier``."""

    def __init__(self, classes):
        super().__init__()
        layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        c = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(c, cout, stride), BasicBlock(cout, cout, 1)]
            c = cout
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def bert_small(classes, layers=6, hidden=384, intermediate=1536):
    """transformers' BertForSequenceClassification (6 layers, hidden 384, 12 heads, intermediate 1536, vocabulary
    30,522, dropout 0 to stay deterministic; BERT-base with 12, 768, 3072), returning the logits only; parameters
    ``bert.*`` and ``classifier.*``."""
    # torchvision here is a CUDA build beside the CPU torch: importing transformers imports torchvision, whose
    # meta registrations then fail ("operator torchvision::nms does not exist"). Nothing here needs them.
    import types
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import transformers

    class Classifier(transformers.BertForSequenceClassification):
        def forward(self, ids):
            return super().forward(input_ids=ids, return_dict=False)[0]

    config = transformers.BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=12, intermediate_size=intermediate, num_labels=classes,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return Classifier(config)


def build(name):
    """Seeded model, in the mode it trains in, with requires_grad set for the workload."""
    torch.manual_seed(0)
    s = SPECS[name]
    if name == "mlp":
        model = mlp()
    elif name == "lenet":
        model = lenet()
    elif name.startswith("mobilenetv2"):
        model = MobileNetV2(s["classes"])
    elif name == "transformer":
        model = TinyBert(vocab=s["vocab"], seq=s["input"][0], classes=s["classes"])
    elif name.startswith("bert_small"):
        model = bert_small(s["classes"])
    elif name == "bert_base":
        model = bert_small(s["classes"], layers=12, hidden=768, intermediate=3072)
    elif name.startswith("resnet18"):
        model = ResNet18(s["classes"])
    else:
        raise KeyError(name)
    if s.get("head_only"):  # transfer learning: frozen backbone (BN uses running stats), train classifier only
        calibrate_batchnorm(model, torch.from_numpy(make_batch(name)[0]))
        model.eval()
        for n, p in model.named_parameters():
            p.requires_grad_(n.startswith("classifier."))
    return model


def calibrate_batchnorm(model, x):
    """Stand-in for pretrained BN statistics: with fresh ones (mean 0, var 1) eval-mode features vanish (~1e-9)."""
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: running stats = this batch's statistics
    model.train()
    with torch.no_grad():
        model(x)
    for m in bns:
        m.momentum = 0.1


def param_split(model):
    """(trainable parameter names, frozen parameter + float buffer names) as in the ONNX initializers."""
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    frozen += [n for n, b in model.named_buffers() if b.is_floating_point()]
    return trainable, frozen


def export_onnx(name, path):
    model = build(name)
    x = torch.from_numpy(make_batch(name)[0])
    mode = torch.onnx.TrainingMode.TRAINING if model.training else torch.onnx.TrainingMode.EVAL
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, export_params=True,
                      do_constant_folding=False, training=mode, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    return model


def flops(name):
    """Forward MACs from layer shapes (Conv2d, Linear, attention matmuls; elementwise ops ignored).

    Training step FLOPs: 3x forward when every layer trains (forward + grad-input + grad-weight);
    with a frozen backbone, forward + 2x the trainable layers.
    """
    model = build(name)
    x = torch.from_numpy(make_batch(name)[0])
    macs = {"all": 0, "trainable": 0}

    def hook(m, inp, out):
        if isinstance(m, nn.Conv2d):
            n = out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
        elif isinstance(m, nn.Linear):
            n = out.numel() * m.in_features
        else:  # SelfAttention: QK^T and AV, the projections are hooked as Linear
            n = 2 * out.shape[0] * m.seq * m.seq * m.d
        macs["all"] += n
        if any(p.requires_grad for p in m.parameters(recurse=False)):
            macs["trainable"] += n

    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear, SelfAttention)):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(x)
    fwd = 2 * macs["all"]
    all_train = all(p.requires_grad for p in model.parameters())
    train = 3 * fwd if all_train else fwd + 2 * 2 * macs["trainable"]
    n_params = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return dict(workload=name, forward_macs=macs["all"], forward_flops=fwd, train_step_flops=train,
                params=n_params, trainable_params=n_train)


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export_onnx(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "flops":
        for w in SPECS:
            print(json.dumps(flops(w)))
