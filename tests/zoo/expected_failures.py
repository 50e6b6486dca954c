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

EXPECTED_FAILURES: dict[tuple[str, ...], str] = {
    **{("gpt2", "dynamo", check): _TIED for check in ("base", "batch", "size", "exports")},
    ("tf_efficientnet_lite0", "torchscript-train", "size"): _LITE0_SIZE,
    ("regnet_x_400mf", "torchscript-train", "base"): _REGNET_BASE,
}
