"""Placeholders: zoo checks that fail today, with the error a user sees (strict xfails in test_zoo.py).

Keys are (model, exporter) for every check of that export, or (model, exporter, check) for one check
(check: generates, base, batch, size, trains, exports). Remove an entry when its fix lands: a strict xfail
that passes fails the run. docs/models.md (python -m tests.zoo.report) has the whole matrix.
"""

# GPT-2 ties the token embedding and the LM head; the dynamo export keeps one initializer for both, named
# model.lm_head.weight, which this harness cannot map back to torch's two names (the gradient is trained once)
_TIED = "AssertionError: not trained: ['model.transformer.wte.weight'] (tied to model.lm_head.weight in the export)"
# training-mode export checked at 96 px with artifacts exported at 64 px: the loss matches, the gradients of the
# last stages do not, on 3 of 3 batches (eval-mode export at 96 px: they match); cause not found yet
_LITE0_SIZE = ("AssertionError: case size, 3 batches: blocks.6.0.bn1.bias: relative gradient error 1.36e-02 "
               "(torch float32: 1.45e-05); ...")


# training-mode export at 64 px, batch 4: the last stage's BatchNorm gradients are off on 3 of 3 batches (the
# second batch size and the second image size pass); torch float32 itself is 8e-5 off there: ill-conditioned
# or a bug, not settled
_REGNET_BASE = ("AssertionError: case base, 3 batches: trunk_output.block4.block4-11.f.c.1.weight: relative "
                "gradient error 3.53e-02 (torch float32: 8.23e-05); ...")

# inference-mode BatchNorm on a random network's running statistics (mean 0, variance 1): the first loss is ~245
# and AdamW at the harness's learning rate diverges; the gradients themselves match torch (base, batch, size)
_EFFNET_EVAL_DIVERGES = "AssertionError: loss did not decrease in 20 AdamW steps: 245.4 -> 1.682e+04"
# larger than torch float32's own error, at one batch size or size only; not investigated yet
_DENSENET_BASE = ("AssertionError: case base, 3 batches: features.denseblock4.denselayer1.conv1.weight: relative "
                  "gradient error 1.22e-01 (torch float32: 4.11e-03); ...")
_DENSENET_BATCH = ("AssertionError: case batch, 3 batches: features.denseblock4.denselayer11.norm1.bias: relative "
                   "gradient error 9.87e-03 (torch float32: 7.34e-07); ...")
# the TorchScript trace bakes MobileViT's unfold reshapes ({4, 64, 16, 4}) at the export size; the dynamo export
# keeps them symbolic and passes at both sizes
_MOBILEVIT_TRACED = ("ExecutionError: the training step failed in a Reshape node: ... Input shape:{4096,4,2,2}, "
                     "requested shape:{4,64,16,4}")

EXPECTED_FAILURES: dict[tuple[str, ...], str] = {
    **{("efficientnet_b0", e, "trains"): _EFFNET_EVAL_DIVERGES for e in ("torchscript-eval", "dynamo")},
    ("densenet121", "torchscript-train", "base"): _DENSENET_BASE,
    **{("densenet121", e, "batch"): _DENSENET_BATCH for e in ("torchscript-eval", "dynamo")},
    **{("mobilevit_xxs", e, c): _MOBILEVIT_TRACED for e in ("torchscript-train", "torchscript-eval")
       for c in ("size", "exports")},
    **{("gpt2", "dynamo", check): _TIED for check in ("base", "batch", "size", "exports")},
    ("tf_efficientnet_lite0", "torchscript-train", "size"): _LITE0_SIZE,
    ("regnet_x_400mf", "torchscript-train", "base"): _REGNET_BASE,
}
