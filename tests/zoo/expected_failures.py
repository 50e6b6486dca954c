"""Placeholders: zoo checks that fail today, with the error a user sees (strict xfails in test_zoo.py).

Keys are (model, exporter) for every check of that export, or (model, exporter, check) for one check
(check: generates, base, batch, size, trains, exports). Remove an entry when its fix lands: a strict xfail
that passes fails the run. docs/models.md (python -m tests.zoo.report) has the whole matrix.
"""

# inference-mode BatchNorm on a random network's running statistics (mean 0, variance 1): the first loss is ~245
# and AdamW at the harness's learning rate diverges; the gradients themselves match torch (base, batch, size)
_EFFNET_EVAL_DIVERGES = "AssertionError: loss did not decrease in 20 AdamW steps: 245.4 -> 1.682e+04"
# the TorchScript trace bakes MobileViT's unfold reshapes ({4, 64, 16, 4}) at the export size; the dynamo export
# keeps them symbolic and passes at both sizes
_MOBILEVIT_TRACED = ("ExecutionError: the training step failed in a Reshape node: ... Input shape:{4096,4,2,2}, "
                     "requested shape:{4,64,16,4}")

# torch.export decomposes T5's attention output reshape into a view of a transposed tensor, which symbolic
# sequence lengths cannot prove contiguous (T5Attention.forward: attn_output.reshape(*input_shape, -1))
_T5_DYNAMO = ("ConversionError: Failed to decompose the FX graph for ONNX compatibility. ... ValueError: Cannot view "
              "a tensor with shape torch.Size([s77, s27, 2, 8]) and strides (16*s27, 8, 8*s27, 1) as a tensor with "
              "shape (s77, s27, 16)!")

# torch's TorchScript exporter has no symbolic for the FFT (the dynamo exporter writes DFT, which trains)
_FNET_TORCHSCRIPT = ("UnsupportedOperatorError: Exporting the operator 'aten::fft_fftn' to ONNX opset version 17 is "
                     "not supported")
_BEIT_DYNAMO = "ConversionError: Failed to decompose the FX graph for ONNX compatibility."
# the dynamo export bakes the interpolated position embeddings at the export size: the source model itself fails
# in onnxruntime at 48 px (17 position rows against 37 tokens)
_DINOV2_DYNAMO = ("ExecutionError: the training step failed in a Add node: ... Attempting to broadcast an axis by a "
                  "dimension other than 1. 17 by 37")
# the dynamo export (optimize=False) writes a bias-free Conv3d's zero bias with the wrong shape: the source model
# itself fails in onnxruntime ("bias must be a 1D tensor of size output_channels (64)")
_R3D_DYNAMO = "ExecutionError: the training step failed in a Conv node: Compute Conv : bias must be a 1D tensor ..."

# torch.export traces nn.RNN (a ReLU recurrence) step by step and specializes the sequence length (the LSTM and GRU
# export as ONNX recurrent ops with a dynamic length)
_RNN_DYNAMO = ("TorchExportError: ... Received user-specified dim hint Dim.DYNAMIC(min=None, max=None), but tracing "
               "inferred a static shape of 8 for dimension inputs['ids'].shape[1].")

# The TorchScript export of Falcon's ALiBi casts to complex128, which no ONNX op takes: the exported model fails
# the ONNX checker and onnxruntime refuses it; the dynamo export computes ALiBi in bfloat16, which onnxruntime's CPU
# provider has no Mul for. The errors name the model's node and the type.
_FALCON_TORCHSCRIPT = ("InvalidModelError: the model is not valid ONNX, so no artifact built from it can be: the ONNX "
                       "checker (full_check=True) rejects it as given: [ShapeInferenceError] (op_type:Cast, node name: "
                       "/model/transformer/Cast): output has unsupported type tensor(complex128). ...")
_FALCON_DYNAMO = ("ArtifactError: the training model cannot be loaded: ... Could not find an implementation for "
                  "Mul(14) node with name 'node_mul_20' (node 'node_mul_20' reads bfloat16, bfloat16: ...)")
# as EfficientNet-B0's: inference-mode BatchNorm on a random Inception-v3 (first loss 15.1 at 128 px), AdamW at the
# harness's learning rate diverges in the dynamo export's run; its gradients match torch (base, batch, size)
_INCEPTION_DYNAMO_DIVERGES = "AssertionError: loss did not decrease in 20 AdamW steps: 15.1 -> 22.4"
# timm's EVA attention passes is_causal as a tensor, which the TorchScript tracer refuses (dynamo exports it)
_EVA02_TORCHSCRIPT = ("TypeError: scaled_dot_product_attention(): argument 'is_causal' must be bool, not Tensor")

# Architectures probed on 2026-11-28 (session 20):
# a 0-d parameter (CLIP's learned temperature) is not trained under requires_grad=None in a TorchScript export, which
# keeps no torch names (artifacts/params.py warns and says how to name it); the dynamo export's records name it
_CLIP_SCALAR = "AssertionError: not trained: ['model.logit_scale'] (trainable: 77, torch: 78)"
# VOLO's Fold (col2im) has a TorchScript symbolic from opset 18 only; the zoo exports at opset 17 (dynamo trains)
_VOLO_TORCHSCRIPT = ("UnsupportedOperatorError: Exporting the operator 'aten::col2im' to ONNX opset version 17 is not "
                     "supported. Support for this operator was added in version 18, try exporting with this version")
# the dynamo export bakes Sequencer2d's LSTM reshapes at the export size: the source model itself fails in
# onnxruntime at 96 px
_SEQUENCER_DYNAMO = ("ExecutionError: the training step failed in a Reshape node ('node__unsafe_view_2'): ... Input "
                     "shape:{52,13,16}, requested shape:{4,13,13,11}")
# torch.export declares the anchors axis of SSDlite's output as an expression that is wrong at other sizes
# (6//(a*b) anchors per location on the 1/64 map: 4 where there are 24 at 96 px); the labels' declared shape comes
# from it, so correct labels are refused at 96 px (292 anchors declared, 312 computed)
_SSDLITE_DYNAMO = "InputError: training step: input 'labels' expects 6*((((s0 - 1)//16)) + 1)*... =292 on axis 1"
_NEST_DYNAMO = "ConversionError: Failed to convert the exported program to an ONNX model."
_TWINS_DYNAMO = "ConversionError: Failed to convert the exported program to an ONNX model."
_LAYOUTLMV3_DYNAMO = "ConversionError: Failed to decompose the FX graph for ONNX compatibility."
# inference-mode BatchNorm on a random network (as EfficientNet-B0's): AdamW at the harness's learning rate diverges
_VISFORMER_EVAL_DIVERGES = "AssertionError: loss did not decrease in 20 AdamW steps: 1.808 -> 94.72"
# Probed on 2026-11-29 (session 25): as EfficientNet-B0's, inference-mode BatchNorm on a random StarNet (its
# gradients match torch at both batches and sizes; the training-mode export trains)
_STARNET_EVAL_DIVERGES = "AssertionError: loss did not decrease in 20 AdamW steps: 1.727 -> 4850"
# torch's TorchScript unfold symbolic (opset 9, constant size) counts a negative dimension on the output's rank: the
# patching of PatchTST and PatchTSMixer, past_values.unfold(-2, 8, 8) over (batch, 32, 2), is written as
# (batch, 2, 4, 8) instead of (batch, 4, 2, 8); onnxruntime refuses the export itself too ("Load model ... failed:
# Node (/model/model/encoder/positional_encoder/Add) Op (Add) [ShapeInferenceError] Incompatible dimensions");
# the dynamo export is right and trains
_PATCHTST_UNFOLD = ("InvalidModelError: the model is not valid ONNX, so no artifact built from it can be: the ONNX "
                    "checker (full_check=True) rejects it as given: [ShapeInferenceError] Inference error(s): "
                    "(op_type:Add, node name: /model/model/encoder/positional_encoder/Add): [ShapeInferenceError] "
                    "Incompatible dimensions")
_PATCHTSMIXER_UNFOLD = ("InvalidModelError: ... (op_type:MatMul, node name: /model/model/encoder/mlp_mixer_encoder/"
                        "mixers.0/channel_feature_mixer/gating_block/attn_layer/MatMul): [ShapeInferenceError] "
                        "Incompatible dimensions for matrix multiplication")
# the dynamo export declares MobileViT v2's attention values (from the first GroupNorm of each transformer block on)
# with the example's number of patches in the last stage, 1 at 64 px (s77, 128, 4, 1), where GroupNorm's input is
# declared with the symbolic count; inference from the inputs cannot name that count through the exporter's computed
# Reshape and Expand targets (timm's math.ceil patch arithmetic), so the declared 1 stands and the scale gradient
# sums over the other axes only. The eval and inference exports are right at 128 px (their check passes)
_MOBILEVITV2_DYNAMO = ("ExecutionError: the training step failed in a Reshape node ('grad/Reshape_113'): ... Input "
                       "shape:{128,1,4}, requested shape:{128}")
# torch's TorchScript exporter fails converting Moonshine's encoder (with partial or full rotary embeddings) in its
# cat symbolic (symbolic_opset9.cat's rank check); the dynamo export trains
_MOONSHINE_TORCHSCRIPT = "AssertionError: All tensors must have the same rank"
# as MobileViT's: the TorchScript trace bakes the unfold reshapes ({4, 64, 2, 2, 4, 4}) at the export size
_MOBILEVITV2_TRACED = ("ExecutionError: the training step failed in a Reshape node ('/stages/stages.2/stages.2.1/"
                       "Reshape_2'): ... Input shape:{4,64,16,16}, requested shape:{4,64,2,2,4,4}")
# as T5's: torch.export decomposes timm MaxViT's window partition into a view of a transposed tensor, which a symbolic
# batch cannot prove contiguous
_MAXVIT_RW_DYNAMO = ("ConversionError: Failed to decompose the FX graph for ONNX compatibility. ... ValueError: Cannot "
                     "view a tensor with shape torch.Size([64*s77, 4, 2, 8]) and strides (64, 8, 32, 1) as a tensor "
                     "with shape (64*s77, 2, 2, 16)!")
# torch.export cannot solve the guard S3D's pooling puts on a dynamic height (the eval-mode TorchScript export trains)
_S3D_DYNAMO = ("TorchExportError: Failed to export the model with torch.export. ... NotImplementedError: The "
               "inequality, Eq((((x/16)//2)) - 2, 0), cannot be solved using solve_univariate_inequality.")

# Architectures probed on 2026-11-29 (session 21):
# timm's halo attention unfolds the padded keys and values; the TorchScript exporter's Unfold needs static sizes, and
# the zoo's export has a dynamic height and width (the dynamo export trains at both sizes)
_HALONET_TORCHSCRIPT = ("SymbolicValueError: Unsupported: ONNX export of operator Unfold, input size not accessible. "
                        "Please feel free to request support or submit a pull request on PyTorch GitHub: ...")
# as S3D's: torch.export cannot solve the guards a stride-2 stage puts on a dynamic height (the TorchScript exports
# train at both sizes)
_LAMBDA_DYNAMO = ("TorchExportError: Failed to export the model with torch.export. ... NotImplementedError: The "
                  "inequality, Eq(-x/32 + (((x/16)//2)), 0), cannot be solved using solve_univariate_inequality.")
_DLA_DYNAMO = ("TorchExportError: Failed to export the model with torch.export. ... NotImplementedError: The "
               "inequality, Eq(x/16 - (((x/8)//2)), 0), cannot be solved using solve_univariate_inequality.")
# the TorchScript trace bakes Funnel's sequence-length-dependent values at the export length: the source model itself is
# 3e-3 off torch's output in onnxruntime at 12 tokens
_FUNNEL_TRACED = "AssertionError: loss 1.43518, torch 1.43629 (float32: 1.43629; size)"
_FUNNEL_TRACED_EXPORTS = "AssertionError: eval model: relative difference 3.25e-03 from torch's eval output (size)"
# torch.export specializes the sequence length of Funnel and Canine (their dynamic-length exports fail)
_FIXED_LENGTH_DYNAMO = ("TorchExportError: Failed to export the model with torch.export. ... Received user-specified "
                        "dim hint Dim.DYNAMIC(min=None, max=None), but tracing inferred a static shape of 8 for "
                        "dimension inputs['x'].shape[1].")
# transformers builds a full (batch, 1, sequence, sequence) attention mask when tracing or exporting, which cannot be
# added to Nystromformer's (batch, heads, landmarks, sequence) landmark scores: both exports fail inside the model
_NYSTROMFORMER_EXPORT = ("RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-singleton "
                         "dimension 2")
# torch's float64 reference is NaN: Canine's local attention mask is (1 - mask.float()) * finfo(float64).min, a
# float32 product that overflows to -inf, and 0 * -inf is NaN (the checks that need no float64 torch pass)
_CANINE_FLOAT64 = ("AssertionError: torch's own float64 runs differ (loss nan, then nan; gradients of "
                   "['model.canine.char_embeddings.HashBucketCodepointEmbedder_0.weight', ...")
# The TorchScript export of Longformer computes another function than torch's where layer 0's sliding-window attention
# reaches the loss (through the first token's global attention; 1e-8 of the gradient's norm at 8 tokens, 1e-7 at 12).
# onnxtrain differentiates the export exactly: its float64 gradient equals the exported model's own central
# differences (key.weight[5]: 5.900e-10 against 5.912e-10; value.weight[0] at 12 tokens: -1.2398e-07 against
# -1.2395e-07), while torch's autograd equals torch's (-9.776e-10 against -9.380e-10; 2.8525e-07 against 2.8550e-07)
_LONGFORMER_TRACED = ("AssertionError: case base, 3 batches: model.longformer.encoder.layer.0.attention.self."
                      "key.weight: relative gradient error 3.61e-02 (torch float32: 7.68e-09); ... in float64 the "
                      "graph's worst error is 3.31e-02")
_LONGFORMER_DYNAMO = ("TorchExportError: Failed to export the model with torch.export. ... "
                      "GuardOnDataDependentSymNode: Could not guard on data-dependent expression 4*u1 < 8 "
                      "(unhinted: 4*u1 < s27).")
# float32 rounding in MobileOne's eval-mode forward after two training steps: on the second batch torch's own float32
# output is 4.7e-5 off its float64 one, the exported inference model 8.5e-5, and that model run in float64
# (onnx.reference) is 7.5e-14 off torch float64 (models.py says why its training gradients are ill-conditioned too)
_MOBILEONE_ROUNDING = "AssertionError: inference model: relative difference 1.20e-04 from torch's eval output (batch)"

# Architectures probed on 2026-11-29 (second sweep):
# The TorchScript trace of torch.nn.MultiheadAttention (inside nn.TransformerEncoder, nn.TransformerDecoder and
# nn.Transformer) records the sequence length as a constant in the head split of F.multi_head_attention_forward
# (q.view(tgt_len, bsz * num_heads, head_dim): requested {8, 4, 8}, the batch kept dynamic): the source model itself
# fails in onnxruntime at 12 tokens. The dynamo export trains at both lengths
_TORCH_MHA_TRACED = ("ExecutionError: the training step failed in a Reshape node ('/encoder/layers.0/self_attn/"
                     "Reshape_4'): ... Input shape:{12,2,16}, requested shape:{8,4,8}")
_TORCH_MHA_TRACED_EXPORTS = ("ExecutionError: the eval step failed in a Reshape node ('/encoder/layers.0/self_attn/"
                             "Reshape_4'): ... Input shape:{12,2,16}, requested shape:{8,4,8}")
# torch.export lowers nn.EmbeddingBag to a Loop over the bags that inserts each bag's mean into a tensor sequence, read
# back by ConcatFromSequence; onnxtrain does not differentiate sequence values (`onnxtrain ops ConcatFromSequence`).
# The TorchScript exports (Gather and ReduceMean) train
_EMBEDDING_BAG_DYNAMO = ("UnsupportedOpError: no gradient rule for op 'ConcatFromSequence' (domain 'ai.onnx') at "
                         "node 'n20', on the path 0.weight -> Shape(n6) -> Reshape(n7) -> Loop(n19_2) -> "
                         "ConcatFromSequence(n20) -> loss, and the ONNX spec defines no function body for it ...")
# F.affine_grid has a TorchScript symbolic from opset 20 only, and the zoo exports at opset 17. Exported at opset 20
# (AffineGrid + GridSample), both TorchScript modes pass every check at both sizes (checked by hand)
_AFFINE_GRID_TORCHSCRIPT = ("UnsupportedOperatorError: Exporting the operator 'aten::affine_grid_generator' to ONNX "
                            "opset version 17 is not supported. Support for this operator was added in version 20, "
                            "try exporting with this version")
# torch.export specializes the image size in F.affine_grid + F.grid_sample (the two alone, with a dynamic height
# and width, fail the same way)
_AFFINE_GRID_DYNAMO = ("TorchExportError: Failed to export the model with torch.export. ... Received user-specified "
                       "dim hint Dim.DYNAMIC(min=None, max=None), but tracing inferred a static shape of 32 for "
                       "dimension inputs['x'].shape[2].")
# AdaptiveAvgPool2d to a size that does not divide the map's: the TorchScript exporter needs static sizes (and with
# them refuses the non-divisible case: "output size that are not factor of input size"); the dynamo export computes
# the windows for the export size (10 -> 3) and keeps them: at 28 px the source model itself is 0.23 (relative) off
# torch's output in onnxruntime, without an error
_ADAPTIVE_POOL_TORCHSCRIPT = ("SymbolicValueError: Unsupported: ONNX export of operator adaptive_avg_pool2d, input "
                              "size not accessible. ...")
_ADAPTIVE_POOL_DYNAMO = "AssertionError: loss 1.59057, torch 1.59478 (float32: 1.59478; size)"
_ADAPTIVE_POOL_DYNAMO_EXPORTS = ("AssertionError: eval model: relative difference 1.81e-01 from torch's eval output "
                                 "(size)")
# segmentation-models-pytorch's FPN keeps an nn.Dropout2d (p=0 here) in its decoder, which the TorchScript
# exporter cannot write in training mode; the eval-mode TorchScript and the dynamo exports train
_FPN_TRAINING_DROPOUT = ("SymbolicValueError: Unsupported: ONNX export of operator aten::feature_dropout, training "
                         "mode. ...")

# Architectures probed on 2026-11-29 (session 28):
# DiffLlama's differential attention normalizes each head pair with nn.RMSNorm, for which torch's TorchScript
# exporter has a symbolic only from opset 23 (the zoo exports at opset 17); the dynamo export trains
_DIFFLLAMA_TORCHSCRIPT = ("UnsupportedOperatorError: Exporting the operator 'aten::rms_norm' to ONNX opset version 17 "
                          "is not supported")
# Gemma 3n's activation sparsity computes its cutoff, Normal(0, 1).icdf(0.95), in every forward: torch.export keeps
# the erfinv (prims.erf_inv), for which the dynamo exporter has no ONNX function (the TorchScript trace folds it to a
# constant and trains)
_GEMMA3N_DYNAMO = ("ConversionError: Failed to convert the exported program to an ONNX model. ... DispatchError: No "
                   "ONNX function found for <OpOverload(op='prims.erf_inv', overload='default')>")
# as T5's: torch.export decomposes Parakeet's attention output reshape (attn_output.reshape(*input_shape, -1)) into a
# view of a transposed tensor, which symbolic frame counts cannot prove contiguous
_PARAKEET_DYNAMO = ("ConversionError: Failed to decompose the FX graph for ONNX compatibility. ... ValueError: Cannot "
                    "view a tensor with shape torch.Size([s77, (((s27 - 1)//4)) + 1, 2, 8]) and strides ... as a "
                    "tensor with shape (s77, (((s27 - 1)//4)) + 1, 16)!")
# as MobileOne's: float32 rounding. At 96 px the eval model of the training-mode export (running statistics from
# 64 px batches) has outputs up to 1.5e3, and torch float32 is itself 3.4e-4 (relative) off torch float64 there;
# onnxtrain's eval model is 1.9e-4 off float64 (at 64 px all three agree within 1e-5)
_MOBILENETV4_HYBRID_ROUNDING = ("AssertionError: eval model: relative difference 1.63e-04 from torch's eval output "
                                "(size)")

EXPECTED_FAILURES: dict[tuple[str, ...], str] = {
    **{("falcon", e): _FALCON_TORCHSCRIPT for e in ("torchscript-train", "torchscript-eval")},
    **{("falcon", "dynamo", c): _FALCON_DYNAMO for c in ("base", "batch", "size", "trains", "exports")},
    **{("eva02", e): _EVA02_TORCHSCRIPT for e in ("torchscript-train", "torchscript-eval")},
    ("inception_v3", "dynamo", "trains"): _INCEPTION_DYNAMO_DIVERGES,
    ("rnn_relu", "dynamo"): _RNN_DYNAMO,
    **{("fnet", e): _FNET_TORCHSCRIPT for e in ("torchscript-train", "torchscript-eval")},
    ("beit", "dynamo"): _BEIT_DYNAMO,
    **{("dinov2", "dynamo", c): _DINOV2_DYNAMO for c in ("size", "exports")},
    **{("r3d_18", "dynamo", c): _R3D_DYNAMO for c in ("base", "batch", "size", "trains", "exports")},
    **{("efficientnet_b0", e, "trains"): _EFFNET_EVAL_DIVERGES for e in ("torchscript-eval", "dynamo")},
    **{("mobilevit_xxs", e, c): _MOBILEVIT_TRACED for e in ("torchscript-train", "torchscript-eval")
       for c in ("size", "exports")},
    ("t5_encoder", "dynamo"): _T5_DYNAMO,
    **{("clip", e, c): _CLIP_SCALAR for e in ("torchscript-train", "torchscript-eval") for c in ("base", "batch")},
    **{("volo", e): _VOLO_TORCHSCRIPT for e in ("torchscript-train", "torchscript-eval")},
    **{("sequencer2d", "dynamo", c): _SEQUENCER_DYNAMO for c in ("size", "exports")},
    **{("ssdlite", "dynamo", c): _SSDLITE_DYNAMO for c in ("size", "exports")},
    ("nest", "dynamo"): _NEST_DYNAMO,
    ("layoutlmv3", "dynamo"): _LAYOUTLMV3_DYNAMO,
    ("twins_svt", "dynamo"): _TWINS_DYNAMO,
    **{("mc3_18", "dynamo", c): _R3D_DYNAMO for c in ("base", "batch", "size", "trains", "exports")},
    ("visformer", "dynamo", "trains"): _VISFORMER_EVAL_DIVERGES,
    ("maxvit_rw", "dynamo"): _MAXVIT_RW_DYNAMO,
    ("s3d", "dynamo"): _S3D_DYNAMO,
    **{("halonet26t", e): _HALONET_TORCHSCRIPT for e in ("torchscript-train", "torchscript-eval")},
    ("lambda_resnet26t", "dynamo"): _LAMBDA_DYNAMO,
    ("dla34", "dynamo"): _DLA_DYNAMO,
    **{("funnel", e, "size"): _FUNNEL_TRACED for e in ("torchscript-train", "torchscript-eval")},
    **{("funnel", e, "exports"): _FUNNEL_TRACED_EXPORTS for e in ("torchscript-train", "torchscript-eval")},
    ("funnel", "dynamo"): _FIXED_LENGTH_DYNAMO,
    **{("nystromformer", e): _NYSTROMFORMER_EXPORT for e in ("torchscript-train", "torchscript-eval", "dynamo")},
    **{("canine", e, c): _CANINE_FLOAT64 for e in ("torchscript-train", "torchscript-eval")
       for c in ("base", "batch", "size")},
    ("canine", "dynamo"): _FIXED_LENGTH_DYNAMO,
    **{("longformer", e, c): _LONGFORMER_TRACED for e in ("torchscript-train", "torchscript-eval")
       for c in ("base", "batch", "size")},
    ("longformer", "dynamo"): _LONGFORMER_DYNAMO,
    ("mobileone_s0", "torchscript-train", "exports"): _MOBILEONE_ROUNDING,
    **{(m, e, "size"): _TORCH_MHA_TRACED for m in ("torch_transformer_encoder", "torch_causal_lm", "torch_seq2seq")
       for e in ("torchscript-train", "torchscript-eval")},
    **{(m, e, "exports"): _TORCH_MHA_TRACED_EXPORTS for m in ("torch_transformer_encoder", "torch_causal_lm",
                                                               "torch_seq2seq")
       for e in ("torchscript-train", "torchscript-eval")},
    ("embedding_bag", "dynamo"): _EMBEDDING_BAG_DYNAMO,
    **{("spatial_transformer", e): _AFFINE_GRID_TORCHSCRIPT for e in ("torchscript-train", "torchscript-eval")},
    ("spatial_transformer", "dynamo"): _AFFINE_GRID_DYNAMO,
    **{("adaptive_pool_uneven", e): _ADAPTIVE_POOL_TORCHSCRIPT for e in ("torchscript-train", "torchscript-eval")},
    ("adaptive_pool_uneven", "dynamo", "size"): _ADAPTIVE_POOL_DYNAMO,
    ("adaptive_pool_uneven", "dynamo", "exports"): _ADAPTIVE_POOL_DYNAMO_EXPORTS,
    ("smp_fpn", "torchscript-train"): _FPN_TRAINING_DROPOUT,
    **{("starnet_s1", e, "trains"): _STARNET_EVAL_DIVERGES for e in ("torchscript-eval", "dynamo")},
    **{("patchtst", e): _PATCHTST_UNFOLD for e in ("torchscript-train", "torchscript-eval")},
    **{("patchtsmixer", e): _PATCHTSMIXER_UNFOLD for e in ("torchscript-train", "torchscript-eval")},
    **{("mobilevitv2_050", e, c): _MOBILEVITV2_TRACED for e in ("torchscript-train", "torchscript-eval")
       for c in ("size", "exports")},
    ("mobilevitv2_050", "dynamo", "size"): _MOBILEVITV2_DYNAMO,
    **{("moonshine", e): _MOONSHINE_TORCHSCRIPT for e in ("torchscript-train", "torchscript-eval")},
    **{("vit_rope_mixed", e): _EVA02_TORCHSCRIPT for e in ("torchscript-train", "torchscript-eval")},
    **{("diffllama", e): _DIFFLLAMA_TORCHSCRIPT for e in ("torchscript-train", "torchscript-eval")},
    ("gemma3n_text", "dynamo"): _GEMMA3N_DYNAMO,
    ("parakeet", "dynamo"): _PARAKEET_DYNAMO,
    ("mobilenetv4_hybrid", "torchscript-train", "exports"): _MOBILENETV4_HYBRID_ROUNDING,
}
