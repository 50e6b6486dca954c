"""The architectures of the zoo, each built from the package that defines it, with random weights.

Every model is deterministic in training mode (dropout, stochastic depth, layer drop and SpecAugment masks
off) so its gradients can be compared with torch's. Inputs are small: 64 px images, 8-token sequences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

CLASSES = 5
VOCAB = 100


@dataclass(frozen=True)
class Spec:
    """One zoo model.

    ``build()`` returns the torch module whose single tensor output the loss reads; ``inputs(batch, size, rng)``
    the model's inputs; ``labels(inputs, rng)`` the loss labels. ``batches`` and ``sizes`` are the two batch
    sizes and the two spatial sizes / sequence lengths the same artifacts are checked at (``sizes[1]`` is
    None when the architecture fixes the size). ``axes`` names the input's dynamic axes beyond the batch.
    """

    name: str
    package: str
    build: Callable
    inputs: Callable
    labels: Callable
    sizes: tuple[int, int | None]
    axes: dict[int, str]
    batches: tuple[int, int] = (4, 3)
    output_axes: dict[int, str] | None = None
    quick: tuple[str, ...] = ()  # the exporters checked in the default test run (the rest: -m slow)
    skip: tuple[str, ...] = ()  # exporters not run at all (an export that takes many minutes: see the entry)


def _image(batch, size, rng):
    return (rng.standard_normal((batch, 3, size, size)).astype(np.float32),)


def _tokens(batch, size, rng):
    return (rng.integers(2, VOCAB, (batch, size)).astype(np.int64),)


def _audio(batch, size, rng):
    return (rng.standard_normal((batch, size)).astype(np.float32),)


def _classes(inputs, rng):
    return rng.integers(0, CLASSES, len(inputs[0])).astype(np.int64)


def _next_tokens(inputs, rng):
    return inputs[0][:, 1:].copy()


IMAGE_AXES = {2: "height", 3: "width"}
SEQUENCE_AXES = {1: "sequence"}


def _torchvision(name, **kwargs):
    def build():
        from tests.zoo.vision import import_torchvision

        return getattr(import_torchvision().models, name)(weights=None, num_classes=CLASSES, **kwargs)

    return build


def _timm(name, **kwargs):
    def build():
        import timm

        return timm.create_model(name, pretrained=False, num_classes=CLASSES, drop_rate=0.0, **kwargs)

    return build


class Logits:
    """Wraps a transformers model so the export has one tensor output: ``logits`` (or ``shift(logits)``)."""

    @staticmethod
    def wrap(model, shift: bool = False):
        import torch

        class _Logits(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, x):
                logits = self.model(x).logits
                # causal LM: the scores at position t predict token t+1; class axis 1 for cross-entropy
                return logits[:, :-1].transpose(1, 2) if shift else logits

        return _Logits()


_TRANSFORMER = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=CLASSES)


def bert():
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB, max_position_embeddings=32, **_TRANSFORMER)
    return Logits.wrap(BertForSequenceClassification(config))


def distilbert():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    config = DistilBertConfig(vocab_size=VOCAB, max_position_embeddings=32, dim=16, n_layers=2, n_heads=2,
                              hidden_dim=32, dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0,
                              num_labels=CLASSES)
    return Logits.wrap(DistilBertForSequenceClassification(config))


def roberta():
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(vocab_size=VOCAB, max_position_embeddings=40, pad_token_id=1, **_TRANSFORMER)
    return Logits.wrap(RobertaForSequenceClassification(config))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    return Logits.wrap(GPT2LMHeadModel(config), shift=True)


def llama():
    """A Llama decoder with grouped-query attention (2 heads, 1 key/value head), RMSNorm, SiLU and rotary
    embeddings; eager attention, since TorchScript cannot convert grouped-query SDPA."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=32, num_key_value_heads=1, pad_token_id=0,
                         hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                         num_labels=CLASSES, attn_implementation="eager")
    return Logits.wrap(LlamaForSequenceClassification(config))


def albert():
    from transformers import AlbertConfig, AlbertForSequenceClassification

    config = AlbertConfig(vocab_size=VOCAB, embedding_size=8, max_position_embeddings=32,
                          classifier_dropout_prob=0.0, **_TRANSFORMER)
    return Logits.wrap(AlbertForSequenceClassification(config))


def deberta():
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    config = DebertaV2Config(vocab_size=VOCAB, max_position_embeddings=32, pooler_dropout=0.0, **_TRANSFORMER)
    return Logits.wrap(DebertaV2ForSequenceClassification(config))


def vit():
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, **_TRANSFORMER)
    return Logits.wrap(ViTForImageClassification(config))


def wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification

    config = Wav2Vec2Config(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                            conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                            num_conv_pos_embedding_groups=2, hidden_dropout=0.0, attention_dropout=0.0,
                            activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
                            mask_time_prob=0.0, mask_feature_prob=0.0, classifier_proj_size=8,
                            num_labels=CLASSES)
    return Logits.wrap(Wav2Vec2ForSequenceClassification(config))


def t5_encoder():
    """T5's encoder (RMSNorm without mean subtraction, relative position buckets, no absolute positions), mean-pooled
    into a linear classifier."""
    import torch
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2, dropout_rate=0.0,
                      relative_attention_num_buckets=8, relative_attention_max_distance=16)

    class _Pooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = T5EncoderModel(config)
            self.head = torch.nn.Linear(16, CLASSES)

        def forward(self, x):
            return self.head(self.encoder(x).last_hidden_state.mean(1))

    return _Pooled()


def whisper():
    """Whisper's audio encoder (Conv1d stem, sinusoidal positions of a fixed length) with its classification head."""
    from transformers import WhisperConfig, WhisperForAudioClassification

    config = WhisperConfig(num_mel_bins=8, d_model=16, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=32, max_source_positions=16,
                           dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
                           classifier_proj_size=8, mask_time_prob=0.0, mask_feature_prob=0.0, num_labels=CLASSES)
    model = WhisperForAudioClassification(config)
    # Whisper freezes its sinusoidal position table; an export carries no requires_grad and the harness trains
    # every float initializer, so the table is trained here (as torch does once it is unfrozen)
    model.encoder.embed_positions.requires_grad_(True)
    return Logits.wrap(model)


def roformer():
    """RoFormer: rotary position embeddings from a sinusoidal table, applied to the queries and keys of each layer."""
    from transformers import RoFormerConfig, RoFormerForSequenceClassification

    config = RoFormerConfig(vocab_size=VOCAB, max_position_embeddings=32, embedding_size=16,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_SMALL_HF)
    model = RoFormerForSequenceClassification(config)
    # the table is frozen in torch; unfrozen here as Whisper's is (an export carries no requires_grad)
    model.roformer.encoder.embed_positions.weight.requires_grad_(True)
    return Logits.wrap(model)


def segformer():
    """SegFormer: overlapping patch embeddings, attention over a spatially reduced sequence (strided Conv), Mix-FFN
    (depthwise Conv), and a decode head that resizes every stage bilinearly to 1/4 of the image: per-pixel logits."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    config = SegformerConfig(num_encoder_blocks=2, depths=(1, 1), sr_ratios=(2, 1), hidden_sizes=(8, 16),
                             patch_sizes=(7, 3), strides=(4, 2), num_attention_heads=(1, 2), mlp_ratios=(2, 2),
                             decoder_hidden_size=16, classifier_dropout_prob=0.0, drop_path_rate=0.0,
                             num_labels=CLASSES)
    return Logits.wrap(SegformerForSemanticSegmentation(config))


def poolformer():
    """PoolFormer-S12's blocks (timm MetaFormer), one per stage, narrow."""
    import torch
    from timm.models.metaformer import GroupNorm1, MetaFormer

    return MetaFormer(depths=(1, 1, 1, 1), dims=(8, 8, 16, 16), downsample_norm=None, mlp_act=torch.nn.GELU,
                      mlp_bias=True, norm_layers=GroupNorm1, layer_scale_init_values=1e-5, res_scale_init_values=None,
                      use_mlp_head=False, num_classes=CLASSES, drop_rate=0.0, drop_path_rate=0.0)


def _hf(model_class: str, config_class: str, **config):
    """A transformers model with its logits as the single output."""
    def build():
        import transformers

        return Logits.wrap(getattr(transformers, model_class)(getattr(transformers, config_class)(**config)))

    return build


def _mlp_mixer(block: str = "mixer"):
    """timm's MLP-Mixer family at 64 px with two blocks (its named configurations fix the depth): token-mixing
    MLPs across patches (mixer), with affine normalization and LayerScale (ResMLP), or spatial gating (gMLP)."""

    def build():
        from timm.layers import GatedMlp
        from timm.models import mlp_mixer

        layers = {"mixer": {},
                  "resmlp": dict(block_layer=mlp_mixer.ResBlock, norm_layer=mlp_mixer.Affine, mlp_ratio=4),
                  "gmlp": dict(block_layer=mlp_mixer.SpatialGatingBlock, mlp_layer=GatedMlp, mlp_ratio=6)}[block]
        return mlp_mixer.MlpMixer(num_classes=CLASSES, img_size=64, patch_size=16, num_blocks=2, embed_dim=32,
                                  **layers)

    return build


def clip_vision():
    """CLIP's vision tower (class embedding, pre-LayerNorm, quick GELU) and its projection as the class scores."""
    import torch
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    config = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=CLASSES)

    class _Embeds(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = CLIPVisionModelWithProjection(config)

        def forward(self, x):
            return self.model(x).image_embeds

    return _Embeds()


def lraspp():
    """torchvision's LR-ASPP segmentation head on MobileNetV3-Large: sigmoid-gated pooled branch, bilinear
    upsampling of both branches and of the logits to the input size."""
    from tests.zoo.vision import import_torchvision

    return _segmentation_logits(import_torchvision().models.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=CLASSES))


def _segmentation_logits(net):
    """A torchvision segmentation model with its ``out`` logits as the single output (it returns a dict)."""
    import torch

    class _Out(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)["out"]

    return _Out()


def r3d_18():
    """torchvision's 3D ResNet-18 for video (Conv3d, BatchNorm3d, 3D pooling)."""
    from tests.zoo.vision import import_torchvision

    return import_torchvision().models.video.r3d_18(weights=None, num_classes=CLASSES)


def _video(batch, size, rng):
    return (rng.standard_normal((batch, 3, 4, size, size)).astype(np.float32),)


def _full_size_pixel_classes(inputs, rng):
    batch, _, height, width = inputs[0].shape
    return rng.integers(0, CLASSES, (batch, height, width)).astype(np.int64)


_SMALL_HF = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                 num_labels=CLASSES)
# a small decoder-only language model with grouped-query attention (one key/value head), eager attention
_SMALL_DECODER = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32, num_labels=CLASSES,
                      pad_token_id=0, attn_implementation="eager")


def _mel(batch, size, rng):
    return (rng.standard_normal((batch, 8, size)).astype(np.float32),)


def _pixel_classes(inputs, rng):
    """A class per pixel of the 1/4-size logits map."""
    batch, _, height, width = inputs[0].shape
    return rng.integers(0, CLASSES, (batch, height // 4, width // 4)).astype(np.int64)


def _recurrent(cell: str, **kwargs):
    """A torch.nn LSTM / GRU / RNN text classifier: embeddings, the recurrence over the sequence (its length known
    only at run time), the outputs averaged over time, a linear head."""

    def build():
        import torch

        class Classifier(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(VOCAB, 16)
                self.rnn = getattr(torch.nn, cell)(16, 16, batch_first=True, **kwargs)
                width = 32 if kwargs.get("bidirectional") else 16
                self.head = torch.nn.Linear(width, CLASSES)

            def forward(self, ids):
                out, _ = self.rnn(self.embed(ids))
                return self.head(out.mean(1))

        return Classifier()

    return build


def _vision(name, package, build, sizes=(64, 96), quick=(), axes=IMAGE_AXES, skip=()):
    return Spec(name, package, build, _image, _classes, sizes if axes else (sizes[0], None), axes, quick=quick,
                skip=skip)


def _text(name, build, labels=_classes, quick=(), output_axes=None):
    return Spec(name, "transformers", build, _tokens, labels, (8, 12), SEQUENCE_AXES, batches=(2, 3),
                output_axes=output_axes, quick=quick)


# -- architectures probed on 2026-11-28 (session 20) as ones nobody here had tried --------------------------------

def _bytes(batch, size, rng):
    """Perceiver's byte-level ids (6 special tokens, then the 256 byte values)."""
    return (rng.integers(6, 262, (batch, size)).astype(np.int64),)


def perceiver():
    """Perceiver IO on bytes: cross-attention from 4 learned latents to the input, self-attention over the latents."""
    from transformers import PerceiverConfig, PerceiverForSequenceClassification

    config = PerceiverConfig(num_latents=4, d_latents=16, d_model=16, num_blocks=1, num_self_attends_per_block=1,
                             num_self_attention_heads=2, num_cross_attention_heads=1, vocab_size=262,
                             max_position_embeddings=32, num_labels=CLASSES, attention_probs_dropout_prob=0.0)
    return Logits.wrap(PerceiverForSequenceClassification(config))


def _frames(batch, size, rng):
    """4 video frames of ``size`` px, (batch, frames, channels, height, width) as VideoMAE reads them."""
    return (rng.standard_normal((batch, 4, 3, size, size)).astype(np.float32),)


def videomae():
    """VideoMAE: tubelet embedding (a Conv3d over 2 frames), fixed sinusoidal positions, mean pooling."""
    from transformers import VideoMAEConfig, VideoMAEForVideoClassification

    config = VideoMAEConfig(image_size=32, patch_size=8, num_frames=4, tubelet_size=2, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, use_mean_pooling=True, **_SMALL_HF)
    return Logits.wrap(VideoMAEForVideoClassification(config))


def vit_mae():
    """ViT-MAE's encoder with its masking: half the patches kept, chosen by an argsort of per-patch noise (here the
    patches' sums, so that torch and the export keep the same ones), gathered and mean-pooled into a classifier."""
    import torch
    from transformers import ViTMAEConfig, ViTMAEModel

    config = ViTMAEConfig(image_size=32, patch_size=8, mask_ratio=0.5, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=32)
    encoder = ViTMAEModel(config)
    encoder.embeddings.position_embeddings.requires_grad_(True)  # a fixed sin-cos table in torch; exports train it

    class _Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = encoder
            self.head = torch.nn.Linear(16, CLASSES)

        def forward(self, x):
            noise = x.unfold(2, 8, 8).unfold(3, 8, 8).sum((1, 4, 5)).reshape(x.shape[0], -1)
            return self.head(self.model(x, noise=noise).last_hidden_state.mean(1))

    return _Masked()


def _two_towers(model_class: str, config_class: str):
    """CLIP / SigLIP with both towers: the image embeddings against the text embeddings of CLASSES fixed prompts (a
    buffer), scaled (and for SigLIP shifted) by the learned temperature: the image half of the contrastive loss is
    the cross-entropy over these logits."""

    def build():
        import torch
        import transformers

        text = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                    max_position_embeddings=16)
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                      patch_size=8)
        extra = dict(projection_dim=8) if model_class == "CLIPModel" else {}
        inner = getattr(transformers, model_class)(getattr(transformers, config_class)(
            text_config=text, vision_config=vision, **extra))

        class _Contrastive(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = inner
                self.register_buffer("prompts", torch.randint(2, VOCAB, (CLASSES, 6)))

            def forward(self, x):
                return self.model(input_ids=self.prompts, pixel_values=x).logits_per_image

        return _Contrastive()

    return build


def _depth_classes():
    """GLPN: a SegFormer encoder with a depth decoder (selective feature fusion, bilinear upsampling); the depth map
    through a 1x1 convolution gives per-pixel class scores."""
    import torch
    from transformers import GLPNConfig, GLPNForDepthEstimation

    config = GLPNConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
                        strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=8,
                        drop_path_rate=0.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        head_in_index=-1, max_depth=10)
    inner = GLPNForDepthEstimation(config)

    class _Depth(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = inner
            self.head = torch.nn.Conv2d(1, CLASSES, 1)

        def forward(self, x):
            return self.head(self.model(x).predicted_depth.unsqueeze(1))

    return _Depth()


def dpt():
    """DPT: a ViT whose layers are reassembled into a feature pyramid (transposed convolutions, a strided
    convolution), fused by residual units with bilinear upsampling; logits at twice the input size."""
    from transformers import DPTConfig, DPTForSemanticSegmentation

    config = DPTConfig(hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32, image_size=32,
                       patch_size=8, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 8, 16, 16],
                       fusion_hidden_size=16, reassemble_factors=[4, 2, 1, 0.5], hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0, num_labels=CLASSES, semantic_classifier_dropout=0.0,
                       use_auxiliary_head=False, head_in_index=-1)
    return Logits.wrap(DPTForSemanticSegmentation(config))


def _double_size_pixel_classes(inputs, rng):
    batch, _, height, width = inputs[0].shape
    return rng.integers(0, CLASSES, (batch, 2 * height, 2 * width)).astype(np.int64)


def _detection_tokens():
    """YOLOS: a ViT with 5 detection tokens and position embeddings interpolated to the input size; the detection
    tokens' class scores, (batch, classes + 1, tokens)."""
    import torch
    from transformers import YolosConfig, YolosForObjectDetection

    config = YolosConfig(image_size=[32, 32], patch_size=8, num_detection_tokens=5, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32, num_labels=CLASSES - 1)
    inner = YolosForObjectDetection(config)

    class _Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = inner

        def forward(self, x):
            return self.model(x).logits.transpose(1, 2)

    return _Tokens()


def _token_classes(inputs, rng):
    return rng.integers(0, CLASSES, (len(inputs[0]), 5)).astype(np.int64)


def _torchvision_direct(module: str, cls: str, **kwargs):
    """A torchvision architecture from its class, where the named builders fix a size the zoo cannot afford."""

    def build():
        import importlib

        from tests.zoo.vision import import_torchvision

        import_torchvision()
        return getattr(importlib.import_module(module), cls)(num_classes=CLASSES, **kwargs)

    return build


def _timm_direct(module: str, cls: str, **kwargs):
    """A timm architecture from its class, with depths its named configurations fix."""

    def build():
        import importlib

        return getattr(importlib.import_module(module), cls)(num_classes=CLASSES, drop_path_rate=0.0, **kwargs)

    return build


def ssdlite():
    """SSDlite320's MobileNetV3 feature extractor, its extra blocks and its classification head (depthwise separable
    convolutions per feature map, flattened and concatenated): class scores per anchor, (batch, classes, anchors)."""
    import torch

    from tests.zoo.vision import import_torchvision

    detector = import_torchvision().models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=CLASSES)

    class _Anchors(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = detector.backbone
            self.head = detector.head.classification_head

        def forward(self, x):
            return self.head(list(self.backbone(x).values())).transpose(1, 2)

    return _Anchors()


def _anchor_classes(inputs, rng):
    """A class per SSDlite anchor: 6 per location of its six feature maps (strides 16 and 32, then halved 4 times)."""
    batch, _, height, _ = inputs[0].shape
    sizes = [-(-height // 16)]
    for _ in range(5):
        sizes.append(-(-sizes[-1] // 2))
    return rng.integers(0, CLASSES, (batch, sum(6 * s * s for s in sizes))).astype(np.int64)


def deeplabv3():
    """torchvision's DeepLabV3 on MobileNetV3-Large: atrous spatial pyramid pooling (dilated convolutions and a
    pooled branch upsampled to the map), logits upsampled to the input size; its Dropout off."""
    import torch

    from tests.zoo.vision import import_torchvision

    net = import_torchvision().models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=CLASSES, aux_loss=False)
    for module in net.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return _segmentation_logits(net)


def _words_and_boxes(batch, size, rng):
    """LayoutLMv3's text and layout in one int64 tensor, (batch, tokens, 5): a token id and its box (x0, y0, x1, y1)."""
    ids = rng.integers(2, VOCAB, (batch, size, 1))
    corner = rng.integers(0, 500, (batch, size, 2))
    return (np.concatenate([ids, corner, corner + rng.integers(1, 400, (batch, size, 2))], -1).astype(np.int64),)


def layoutlmv3():
    """LayoutLMv3 on text and boxes (no image): x, y, width and height embeddings of each token's box added to its
    word and position embeddings. The relative and spatial attention biases stay off: torch computes them under
    no_grad, so their tables get no gradient in torch but would in any export."""
    import torch
    from transformers import LayoutLMv3Config, LayoutLMv3ForSequenceClassification

    config = LayoutLMv3Config(vocab_size=VOCAB, max_position_embeddings=40, max_2d_position_embeddings=1024,
                              coordinate_size=3, shape_size=2, has_relative_attention_bias=False,
                              has_spatial_attention_bias=False, visual_embed=False, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0, classifier_dropout=0.0, pad_token_id=1, **_SMALL_HF)
    inner = LayoutLMv3ForSequenceClassification(config)

    class _Boxes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = inner

        def forward(self, x):
            return self.model(input_ids=x[..., 0], bbox=x[..., 1:]).logits

    return _Boxes()


def cvt():
    """CvT: convolutional token embeddings, queries, keys and values from depthwise convolutions with BatchNorm
    over the token grid (keys and values strided), a class token in the last stage only (torch.split of the
    tokens, by sizes read from the shape)."""
    from transformers import CvtConfig, CvtForImageClassification

    stages = 3
    config = CvtConfig(embed_dim=[8, 16, 16], num_heads=[1, 2, 2], depth=[1, 2, 3], patch_sizes=[7, 3, 3],
                       patch_stride=[4, 2, 2], patch_padding=[2, 1, 1], mlp_ratio=[2.0] * stages,
                       attention_drop_rate=[0.0] * stages, drop_rate=[0.0] * stages, drop_path_rate=[0.0] * stages,
                       qkv_bias=[True] * stages, cls_token=[False, False, True],
                       qkv_projection_method=["dw_bn"] * stages,
                       kernel_qkv=[3] * stages, padding_kv=[1] * stages, stride_kv=[2] * stages,
                       padding_q=[1] * stages, stride_q=[1] * stages, num_labels=CLASSES)
    return Logits.wrap(CvtForImageClassification(config))


def mc3_18():
    """torchvision's mixed-convolution video ResNet: a 3D stem and first stage, 2D-in-3D convolutions after."""
    from tests.zoo.vision import import_torchvision

    return import_torchvision().models.video.mc3_18(weights=None, num_classes=CLASSES)


def s3d():
    """torchvision's S3D: separable 3D convolutions (a 1xkxk then a kx1x1 Conv3d, each with BatchNorm3d of
    momentum 0.001 and eps 0.001) in inception blocks, 3D max pooling. Its head's AvgPool3d((2, 7, 7)) needs
    16 frames of 224 px; here a (1, 2, 2) one, so that 8 frames of 64 px (a 1 x 2 x 2 feature map) suffice."""
    import torch

    from tests.zoo.vision import import_torchvision

    model = import_torchvision().models.video.s3d(weights=None, num_classes=CLASSES, dropout=0.0)
    model.avgpool = torch.nn.AvgPool3d(kernel_size=(1, 2, 2), stride=1)
    return model


def _video8(batch, size, rng):
    return (rng.standard_normal((batch, 3, 8, size, size)).astype(np.float32),)


# -- architectures probed on 2026-11-29 (session 21) as ones nobody here had tried --------------------------------

def _narrow(channels: int) -> int:
    """A sixteenth of a timm stage width, a multiple of 8 (grouped and depthwise convolutions stay valid)."""
    return max(8, channels // 16 // 8 * 8)


_BYOA = "timm.models.byoanet"  # timm's attention configurations of ByobNet


def _byob(variant: str, module: str = "timm.models.byobnet", **attn_kwargs):
    """A timm ByobNet configuration (``model_cfgs[variant]`` of ``module``) cut to one block per stage (an
    interleaved stage keeps one block of each kind) at a sixteenth of the width; ``attn_kwargs`` replace the
    self-attention's (window sizes the 64 px maps allow)."""

    def build():
        import dataclasses
        import importlib

        from timm.models.byobnet import ByobNet

        def small(block):
            return dataclasses.replace(block, d=1, c=_narrow(block.c))

        cfg = importlib.import_module(module).model_cfgs[variant]
        blocks = tuple(tuple(small(b) for b in s) if isinstance(s, (tuple, list)) else small(s) for s in cfg.blocks)
        stem = _narrow(cfg.stem_chs) if isinstance(cfg.stem_chs, int) else tuple(_narrow(c) for c in cfg.stem_chs)
        cfg = dataclasses.replace(cfg, blocks=blocks, stem_chs=stem,
                                  self_attn_kwargs={**cfg.self_attn_kwargs, **attn_kwargs})
        return ByobNet(cfg, num_classes=CLASSES, img_size=64 if cfg.fixed_input_size else None, drop_path_rate=0.0)

    return build


def _timm_cfg(module: str, cls: str, variant: str, **changes):
    """A timm architecture from its class and its named configuration ``variant`` (a dict or a dataclass) with
    ``changes`` (depths and widths the zoo can afford)."""

    def build():
        import dataclasses
        import importlib

        models = importlib.import_module(module)
        cfg = models.model_cfgs[variant]
        cfg = {**cfg, **changes} if isinstance(cfg, dict) else dataclasses.replace(cfg, **changes)
        return getattr(models, cls)(cfg, num_classes=CLASSES, drop_path_rate=0.0)

    return build


def cspresnet():
    """timm's CSPResNet-50 cut to one bottleneck per stage: cross-stage partial stages (the map split in two
    halves by a 1x1 convolution's channels, one half through the blocks, concatenated back)."""
    import dataclasses

    from timm.models import cspnet

    cfg = cspnet.model_cfgs["cspresnet50"]
    cfg = dataclasses.replace(cfg, stem=dataclasses.replace(cfg.stem, out_chs=16),
                              stages=dataclasses.replace(cfg.stages, depth=(1, 1, 1, 1), out_chs=(32, 64, 64, 128)))
    return cspnet.CspNet(cfg, num_classes=CLASSES, drop_path_rate=0.0)


def efficientnetv2_rw_t():
    """timm's EfficientNetV2-tiny at a quarter of the width and depth: fused MBConv (a full 3x3 convolution in
    place of the expansion and depthwise pair) in the early stages, MBConv with squeeze-excitation after."""
    from timm.models.efficientnet import _gen_efficientnetv2_s

    return _gen_efficientnetv2_s("efficientnetv2_rw_t", channel_multiplier=0.25, depth_multiplier=0.25,
                                 num_classes=CLASSES, drop_rate=0.0, drop_path_rate=0.0)


def resnetv2_bit():
    """timm's BiT ResNetV2-50x1 with one block per stage: pre-activation bottlenecks with GroupNorm, convolutions
    whose weights are standardized in the forward (StdConv2d: each filter's mean and variance, by batch_norm over
    the weight), a fixed-padding stem."""
    from functools import partial

    from timm.layers import StdConv2d
    from timm.models.resnetv2 import ResNetV2

    return ResNetV2(layers=(1, 1, 1, 1), channels=(128, 128, 256, 256), stem_chs=32, stem_type="fixed",
                    conv_layer=partial(StdConv2d, eps=1e-8), num_classes=CLASSES)


def bart():
    """BART as a denoising seq2seq model: the encoder reads the tokens, the decoder reads them shifted right
    (BartModel's own shift_tokens_right, with the decoder start token) and predicts each one through cross-attention
    and the tied LM head; (batch, vocabulary, positions) for cross-entropy against the tokens."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=VOCAB, max_position_embeddings=32, d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
                        decoder_layerdrop=0.0)
    inner = BartForConditionalGeneration(config)
    # the logits' bias is a buffer in torch; a TorchScript export cannot tell it from a parameter (the harness trains
    # every float initializer), so it is one here, as Whisper's position table is trained
    bias = inner.final_logits_bias
    del inner.final_logits_bias
    inner.final_logits_bias = torch.nn.Parameter(bias.clone())

    class _Denoising(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = inner

        def forward(self, x):
            return self.model(input_ids=x).logits.transpose(1, 2)

    return _Denoising()


def _same_tokens(inputs, rng):
    return inputs[0].copy()


def _spectrogram(batch, size, rng):
    """AST's input: ``size`` frames of 16 mel bins, (batch, time, frequency)."""
    return (rng.standard_normal((batch, size, 16)).astype(np.float32),)


def _float32_eps(build):
    """``build`` with each BatchNorm's epsilon rounded to float32, the value the exported attribute holds.

    For a gradient that exists only through epsilon (a per-channel scale right before a training-mode BatchNorm,
    which normalizes the scale away) the float32 rounding of 1e-5 (2.5e-9, relative) moves the exact gradient by up
    to 3e-6 (relative): the float64 check would then compare two different models."""

    def rounded():
        import torch

        model = build()
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.eps = float(np.float32(module.eps))
        return model

    return rounded


# -- architectures probed on 2026-11-29 (second sweep): diffusers, segmentation-models-pytorch and plain torch.nn ----

PAD = 0


def _padded_tokens(batch, size, rng):
    """Token ids with padding (id 0) from a random position on in every other sequence (2 real tokens or more)."""
    ids = rng.integers(2, VOCAB, (batch, size))
    for row in range(1, batch, 2):
        ids[row, rng.integers(2, size):] = PAD
    return (ids.astype(np.int64),)


def _scaled_pixel_classes(factor: float):
    """A class per pixel of a logits map ``factor`` times the input's height and width."""

    def labels(inputs, rng):
        batch, _, height, width = inputs[0].shape
        return rng.integers(0, CLASSES, (batch, int(height * factor), int(width * factor))).astype(np.int64)

    return labels


def _importorskip(package: str):
    """The package, or the test skipped when it is not installed (it is not among the test extras)."""
    import pytest

    return pytest.importorskip(package)


def torch_transformer_encoder():
    """nn.TransformerEncoder (batch_first, post-norm) over embeddings with a padding index, a key padding mask from the
    ids and mean pooling over the real tokens. In eval mode without gradients torch runs its fast path (nested
    tensors, padded outputs zero), which the pooling ignores."""
    import torch

    class _Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 16, padding_idx=PAD)
            self.positions = torch.nn.Parameter(0.1 * torch.randn(32, 16))
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 2)
            self.head = torch.nn.Linear(16, CLASSES)

        def forward(self, ids):
            pad = ids == PAD
            x = self.encoder(self.embed(ids) + self.positions[:ids.shape[1]], src_key_padding_mask=pad)
            keep = (~pad).unsqueeze(-1).to(x.dtype)
            return self.head((x * keep).sum(1) / keep.sum(1))

    return _Encoder()


def torch_causal_lm():
    """A decoder-only language model from nn.TransformerEncoder (pre-norm, GELU) with the causal mask users build
    each forward (nn.Transformer.generate_square_subsequent_mask of the length) and a key padding mask."""
    import torch

    class _CausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 16)
            self.positions = torch.nn.Parameter(0.1 * torch.randn(32, 16))
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True,
                                                     norm_first=True)
            self.decoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(16, VOCAB)

        def forward(self, ids):
            length = ids.shape[1]
            causal = torch.nn.Transformer.generate_square_subsequent_mask(length)
            x = self.decoder(self.embed(ids) + self.positions[:length], mask=causal, is_causal=True,
                             src_key_padding_mask=ids == PAD)
            return self.head(x)[:, :-1].transpose(1, 2)

    return _CausalLM()


def torch_seq2seq():
    """nn.Transformer (batch_first, one encoder and one decoder layer): the decoder reads the ids shifted right with
    a causal mask and predicts them through cross-attention to the encoded ids."""
    import torch

    class _Seq2Seq(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 16)
            self.transformer = torch.nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True)
            self.head = torch.nn.Linear(16, VOCAB)

        def forward(self, ids):
            shifted = torch.cat([torch.ones_like(ids[:, :1]), ids[:, :-1]], 1)
            causal = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
            x = self.transformer(self.embed(ids), self.embed(shifted), tgt_mask=causal, tgt_is_causal=True)
            return self.head(x).transpose(1, 2)

    return _Seq2Seq()


def sdpa_causal_lm():
    """A hand-written decoder block: fused QKV projection, F.scaled_dot_product_attention(is_causal=True), RMS-free
    LayerNorm pre-norm, a GELU MLP; next-token logits."""
    import torch
    import torch.nn.functional as F

    class _Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(16), torch.nn.LayerNorm(16)
            self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))

        def forward(self, x):
            batch, length, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, 2, 8).permute(2, 0, 3, 1, 4)
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(attn.transpose(1, 2).reshape(batch, length, 16))
            return x + self.mlp(self.norm2(x))

    class _LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 16)
            self.positions = torch.nn.Parameter(0.1 * torch.randn(32, 16))
            self.blocks = torch.nn.Sequential(_Block(), _Block())
            self.head = torch.nn.Linear(16, VOCAB)

        def forward(self, ids):
            x = self.blocks(self.embed(ids) + self.positions[:ids.shape[1]])
            return self.head(x)[:, :-1].transpose(1, 2)

    return _LM()


def _latent_map(batch, size, rng):
    return (rng.standard_normal((batch, 8, size, size)).astype(np.float32),)


def gan_generator():
    """A pix2pix / DCGAN-style generator from a latent map: ConvTranspose2d (stride 2) + InstanceNorm2d + ReLU, then
    ConvTranspose2d + Tanh; the Tanh outputs read as per-pixel class scores at 4x the latent size."""
    import torch

    nn = torch.nn
    return nn.Sequential(nn.ConvTranspose2d(8, 16, 4, 2, 1), nn.InstanceNorm2d(16, affine=True), nn.ReLU(),
                         nn.ConvTranspose2d(16, CLASSES, 4, 2, 1), nn.Tanh())


def espcn():
    """ESPCN super-resolution: Tanh convolutions, then PixelShuffle(2) (sub-pixel convolution) to twice the size."""
    import torch

    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 16, 5, padding=2), nn.Tanh(), nn.Conv2d(16, 8, 3, padding=1), nn.Tanh(),
                         nn.Conv2d(8, CLASSES * 4, 3, padding=1), nn.PixelShuffle(2))


def spatial_transformer():
    """A spatial transformer network: a localization net regresses a 2x3 affine matrix, F.affine_grid builds the
    sampling grid for the input's size and F.grid_sample (bilinear) resamples the image before a small classifier."""
    import torch
    import torch.nn.functional as F

    nn = torch.nn

    class _STN(nn.Module):
        def __init__(self):
            super().__init__()
            self.localization = nn.Sequential(nn.Conv2d(3, 8, 5, stride=2), nn.MaxPool2d(2), nn.ReLU(),
                                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 6))
            with torch.no_grad():
                self.localization[-1].weight.mul_(0.1)
                self.localization[-1].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1, 0]))
            self.classifier = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                            nn.Flatten(), nn.Linear(8, CLASSES))

        def forward(self, x):
            theta = self.localization(x).view(-1, 2, 3)
            grid = F.affine_grid(theta, list(x.size()), align_corners=False)
            return self.classifier(F.grid_sample(x, grid, align_corners=False))

    return _STN()


def unet_bilinear():
    """A two-level U-Net (Conv + BatchNorm + ReLU blocks, max pooling) whose decoder upsamples with
    F.interpolate(bilinear, align_corners=True) to the skip connection's size and concatenates; per-pixel logits."""
    import torch
    import torch.nn.functional as F

    nn = torch.nn

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    class _UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.down1, self.down2, self.bottom = block(3, 8), block(8, 16), block(16, 16)
            self.up2, self.up1 = block(32, 8), block(16, 8)
            self.head = nn.Conv2d(8, CLASSES, 1)

        def forward(self, x):
            d1 = self.down1(x)
            d2 = self.down2(F.max_pool2d(d1, 2))
            b = self.bottom(F.max_pool2d(d2, 2))
            up = F.interpolate(b, size=d2.shape[2:], mode="bilinear", align_corners=True)
            u2 = self.up2(torch.cat([up, d2], 1))
            up = F.interpolate(u2, size=d1.shape[2:], mode="bilinear", align_corners=True)
            return self.head(self.up1(torch.cat([up, d1], 1)))

    return _UNet()


def tcn():
    """A temporal convolutional network: dilated causal Conv1d (left padding by F.pad, dilations 1, 2, 4) with weight
    normalization (torch.nn.utils.parametrizations.weight_norm), residual blocks, mean over time."""
    import torch
    import torch.nn.functional as F
    from torch.nn.utils.parametrizations import weight_norm

    nn = torch.nn

    class _Causal(nn.Module):
        def __init__(self, channels, dilation):
            super().__init__()
            self.pad = 2 * dilation
            self.conv = weight_norm(nn.Conv1d(channels, channels, 3, dilation=dilation))

        def forward(self, x):
            return x + F.relu(self.conv(F.pad(x, (self.pad, 0))))

    class _TCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(nn.Conv1d(8, 16, 1), *[_Causal(16, d) for d in (1, 2, 4)])
            self.head = nn.Linear(16, CLASSES)

        def forward(self, x):
            return self.head(self.blocks(x).mean(2))

    return _TCN()


def embedding_bag():
    """nn.EmbeddingBag(mode="mean") over fixed-length bags (a 2-D id tensor), a ReLU MLP head (fastText-style)."""
    import torch

    nn = torch.nn
    return nn.Sequential(nn.EmbeddingBag(VOCAB, 16, mode="mean"), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, CLASSES))


def tensor_ops():
    """Ops users write by hand: LocalResponseNorm, a cumulative sum over the width (an integral image), a 1x1
    projection by torch.einsum, global average pooling."""
    import torch

    nn = torch.nn

    class _Ops(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.lrn = nn.LocalResponseNorm(3)
            self.mix = nn.Parameter(torch.randn(16, 8) / 4)
            self.head = nn.Linear(16, CLASSES)

        def forward(self, x):
            x = self.lrn(torch.relu(self.conv(x)))
            x = torch.cumsum(x, 3) / x.shape[3]
            x = torch.einsum("bchw,oc->bohw", x, self.mix)
            return self.head(x.mean((2, 3)))

    return _Ops()


def adaptive_pool_uneven():
    """AdaptiveAvgPool2d to 3 x 3 from maps whose size 3 does not divide (10 and 14 px): overlapping windows of
    varying size, then a linear head. (An AdaptiveMaxPool2d beside it made the dynamo export fail: torch's ONNX
    registry has no function for aten.adaptive_max_pool2d.)"""
    import torch

    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.AdaptiveAvgPool2d(3), nn.Flatten(),
                         nn.Linear(72, CLASSES))


def _features_and_noise(batch, size, rng):
    """A VAE's input: 16 features, then the ``size - 16`` standard normal values of its reparameterization noise."""
    return (rng.standard_normal((batch, size)).astype(np.float32),)


def vae_head():
    """A VAE-style classifier: an encoder to a mean and a log-variance, z = mu + exp(logvar / 2) * eps with the noise
    eps an explicit part of the input (so that the export and torch draw the same), a decoder to class scores."""
    import torch

    nn = torch.nn

    class _VAE(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
            self.mu, self.logvar = nn.Linear(32, 8), nn.Linear(32, 8)
            self.decoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, CLASSES))

        def forward(self, x):
            h = self.encoder(x[:, :16])
            z = self.mu(h) + torch.exp(0.5 * self.logvar(h)) * x[:, 16:]
            return self.decoder(z)

    return _VAE()


def _noisy_image_and_timestep(batch, size, rng):
    """A diffusion UNet's inputs in one tensor: 3 image channels, then a channel filled with the sample's timestep."""
    image = rng.standard_normal((batch, 3, size, size))
    steps = np.broadcast_to(rng.integers(0, 1000, (batch, 1, 1, 1)), (batch, 1, size, size))
    return (np.concatenate([image, steps], 1).astype(np.float32),)


def diffusers_unet2d():
    """diffusers' UNet2DModel: sinusoidal timestep embedding and its MLP, ResNet blocks with GroupNorm and SiLU, an
    attention down and up block, strided-convolution downsampling, nearest upsampling; the timestep per sample read
    from the input's fourth channel, the predicted noise read as per-pixel class scores."""
    diffusers = _importorskip("diffusers")
    import torch

    unet = diffusers.UNet2DModel(sample_size=16, in_channels=3, out_channels=CLASSES, layers_per_block=1,
                                 block_out_channels=(8, 16), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4,
                                 attention_head_dim=8, dropout=0.0)

    class _Denoiser(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.unet = unet

        def forward(self, x):
            return self.unet(x[:, :3], x[:, 3, 0, 0]).sample

    return _Denoiser()


def diffusers_vae_encoder():
    """diffusers' AutoencoderKL encoder (GroupNorm + SiLU ResNet blocks, a mid-block self-attention, asymmetric padding
    before the strided downsampling convolution) and its quant_conv: the latent mean, through a 1x1 convolution, as
    per-pixel class scores at half the size."""
    diffusers = _importorskip("diffusers")
    import torch

    vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1,
                                  down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                                  up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), latent_channels=4,
                                  norm_num_groups=4, sample_size=16)

    class _Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.quant_conv = vae.encoder, vae.quant_conv
            self.head = torch.nn.Conv2d(4, CLASSES, 1)

        def forward(self, x):
            mean, _ = self.quant_conv(self.encoder(x)).chunk(2, 1)
            return self.head(mean)

    return _Encoder()


def _smp(arch: str, encoder: str, **kwargs):
    """A segmentation-models-pytorch model with random weights (encoder_weights=None)."""

    def build():
        smp = _importorskip("segmentation_models_pytorch")
        model = getattr(smp, arch)(encoder_name=encoder, encoder_weights=None, classes=CLASSES, **kwargs)
        # a shallower encoder_depth keeps the deeper ResNet stages, unused: dropped, as torch never runs them
        for stage in range(kwargs.get("encoder_depth", 5), 5):
            if hasattr(model.encoder, f"layer{stage}"):
                delattr(model.encoder, f"layer{stage}")
        return model

    return build


# -- architectures probed on 2026-11-29 (session 26): time series, speech encoders, super-resolution ---------------

def _series(batch, size, rng):
    """A multivariate time series: ``size`` steps of 2 channels, (batch, time, channels) as PatchTST reads it."""
    return (rng.standard_normal((batch, size, 2)).astype(np.float32),)


class _Output:
    """Wraps a transformers model so the export has one tensor output: the output field ``field``."""

    @staticmethod
    def wrap(model, field: str):
        import torch

        class _Field(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, x):
                return getattr(self.model(x), field)

        return _Field()


def _hf_field(model_class: str, config_class: str, field: str, **config):
    def build():
        import transformers

        return _Output.wrap(getattr(transformers, model_class)(getattr(transformers, config_class)(**config)), field)

    return build


def _pooled_encoder(model_class: str, config_class: str, width: int, encoder: bool = True, **config):
    """A transformers encoder (``get_encoder()`` of ``model_class``, or the model itself), its last hidden state
    averaged over time into a linear classifier."""

    def build():
        import torch
        import transformers

        class _Pooled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
                self.encoder = model.get_encoder() if encoder else model
                self.head = torch.nn.Linear(width, CLASSES)

            def forward(self, x):
                return self.head(self.encoder(x).last_hidden_state.mean(1))

        return _Pooled()

    return build


def _filterbank(batch, size, rng):
    """``size`` frames of 8 filterbank features, (batch, time, features) as Speech2Text reads them."""
    return (rng.standard_normal((batch, size, 8)).astype(np.float32),)


_SMALL_AUDIO = dict(conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), hidden_dropout=0.0,
                    attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
                    layerdrop=0.0, mask_time_prob=0.0, mask_feature_prob=0.0, classifier_proj_size=8, **_SMALL_HF)


def patchtst():
    """PatchTST as a classifier of 2-channel series of 32 steps (patches of 8)."""
    from transformers import PatchTSTConfig, PatchTSTForClassification

    config = PatchTSTConfig(num_input_channels=2, context_length=32, patch_length=8, patch_stride=8, d_model=16,
                            num_attention_heads=2, num_hidden_layers=2, ffn_dim=32, num_targets=CLASSES)
    model = PatchTSTForClassification(config)
    # the sinusoidal position table is a frozen parameter; unfrozen as Whisper's is (an export carries no
    # requires_grad, and the harness trains every float initializer)
    model.model.encoder.positional_encoder.position_enc.requires_grad_(True)
    return _Output.wrap(model, "prediction_logits")


def wav2vec2_conformer():
    """wav2vec2-Conformer with rotary attention. Its rotary module keeps the table of the last length it saw as a
    Python attribute and returns it when the length repeats: the harness's BatchNorm calibration runs the model at
    the export length, so a trace would then take that table for a constant (the exports failed at 640 samples:
    "Attempting to broadcast an axis by a dimension other than 1. 39 by 63"). The table is recomputed on every
    call here, as on the first call of a fresh model."""
    import torch
    from transformers import Wav2Vec2ConformerConfig, Wav2Vec2ConformerForSequenceClassification

    config = Wav2Vec2ConformerConfig(num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2,
                                     position_embeddings_type="rotary", conv_depthwise_kernel_size=3,
                                     conformer_conv_dropout=0.0, **_SMALL_AUDIO)

    class _Uncached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Wav2Vec2ConformerForSequenceClassification(config)

        def forward(self, x):
            self.model.wav2vec2_conformer.encoder.embed_positions.cached_rotary_positional_embedding = None
            return self.model(x).logits

    return _Uncached()


def lfm2():
    """LFM2 (Liquid AI's on-device language model) as a causal language model: one layer of gated short causal
    convolution (a depthwise Conv1d over 3 steps between two gates), one of grouped-query attention."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    config = Lfm2Config(layer_types=["conv", "full_attention"],
                        **{k: v for k, v in _SMALL_DECODER.items() if k != "num_labels"})
    return Logits.wrap(Lfm2ForCausalLM(config), shift=True)


def _causal_lm(model_class: str, config_class: str, **config):
    """A transformers causal language model, its shifted logits as the single output."""

    def build():
        import transformers

        return Logits.wrap(getattr(transformers, model_class)(getattr(transformers, config_class)(**config)),
                           shift=True)

    return build


def mobilenetv4_hybrid():
    """timm's MobileNetV4-Hybrid-Medium at a quarter of its width: universal inverted bottlenecks, then mobile
    multi-query attention (one key/value head, keys and values from a strided depthwise convolution) with
    LayerScale."""
    from timm.models.mobilenetv3 import _gen_mobilenet_v4

    return _gen_mobilenet_v4("mobilenetv4_hybrid_medium", 0.25, num_classes=CLASSES, drop_rate=0.0,
                             drop_path_rate=0.0)


# a small decoder without a classification head: the causal language models below
_SMALL_LM = {k: v for k, v in _SMALL_DECODER.items() if k != "num_labels"}


ZOO: dict[str, Spec] = {s.name: s for s in [
    _vision("resnet18", "torchvision", _torchvision("resnet18"), quick=("torchscript-train",)),
    _vision("mobilenet_v3_small", "torchvision", _torchvision("mobilenet_v3_small", dropout=0.0)),
    _vision("efficientnet_b0", "torchvision",
            _torchvision("efficientnet_b0", dropout=0.0, stochastic_depth_prob=0.0)),
    _vision("shufflenet_v2_x0_5", "torchvision", _torchvision("shufflenet_v2_x0_5")),
    _vision("squeezenet1_1", "torchvision", _torchvision("squeezenet1_1", dropout=0.0)),
    _vision("regnet_x_400mf", "torchvision", _torchvision("regnet_x_400mf")),
    _vision("densenet121", "torchvision", _torchvision("densenet121")),
    _vision("mnasnet0_5", "torchvision", _torchvision("mnasnet0_5", dropout=0.0)),
    _vision("ghostnet_050", "timm", _timm("ghostnet_050")),
    _vision("tf_efficientnet_lite0", "timm", _timm("tf_efficientnet_lite0")),
    _vision("tf_mobilenetv3_small_100", "timm", _timm("tf_mobilenetv3_small_100")),
    _vision("convnext_atto", "timm", _timm("convnext_atto")),
    # the position embedding fixes the image size (32 px: 2 x 2 patches of 16)
    _vision("deit_tiny_patch16_224", "timm", _timm("deit_tiny_patch16_224", img_size=32), sizes=(32, None),
            axes={}),
    _vision("mobilevit_xxs", "timm", _timm("mobilevit_xxs"), sizes=(64, 128)),
    _text("bert", bert, quick=("torchscript-train", "torchscript-eval")),
    _text("distilbert", distilbert),
    _text("roberta", roberta),
    _text("gpt2", gpt2, labels=_next_tokens, output_axes={2: "positions"}),
    _text("llama", llama),
    _text("albert", albert),
    _text("deberta_v2", deberta),
    _vision("vit", "transformers", vit, sizes=(32, None), axes={}),
    Spec("wav2vec2", "transformers", wav2vec2, _audio, _classes, (400, 640), {1: "samples"}, batches=(2, 3)),
    # slow only: shifted-window attention (Roll, window partition, relative position bias), attention masks
    # built for the input size on each forward
    _vision("swin", "timm", _timm("swin_tiny_patch4_window7_224", img_size=32, window_size=4, embed_dim=16,
                                  depths=(2, 2), num_heads=(1, 2), dynamic_img_size=True, drop_path_rate=0.0),
            sizes=(32, 64)),
    # ReLU linear attention (padded values, a division by the key sum), multi-scale grouped Conv, Hardswish
    _vision("efficientvit_b0", "timm", _timm("efficientvit_b0", widths=(8, 8, 16, 16, 32), depths=(1, 1, 1, 1, 1),
                                             head_dim=8, head_widths=(32, 32))),
    # pooling token mixer (AvgPool without padded counts minus its input), GroupNorm with one group, LayerScale
    _vision("poolformer", "timm", poolformer),
    # attention biases gathered from a table by a constant index, BatchNorm1d after every Linear, Hardswish; the
    # biases fix the size (64 px: 4 x 4 after the stride-16 stem)
    _vision("levit", "timm", _timm("levit_128s", img_size=64, embed_dim=(16, 24, 32), key_dim=8, num_heads=(2, 2, 2),
                                   depth=(1, 1, 1)), axes={}),
    # cross-covariance attention over L2-normalized queries and keys with a learned temperature, Fourier position
    # encoding computed for the input size, class-attention layers
    _vision("xcit", "timm", _timm("xcit_nano_12_p16_224", img_size=32, embed_dim=16, depth=1, num_heads=2,
                                  cls_attn_layers=1), sizes=(32, 64)),
    _text("t5_encoder", t5_encoder),
    # the sinusoidal positions fix the length: 2 x max_source_positions mel frames
    Spec("whisper", "transformers", whisper, _mel, _classes, (32, None), {}, batches=(2, 3)),
    Spec("segformer", "transformers", segformer, _image, _pixel_classes, (64, 96), IMAGE_AXES,
         output_axes={2: "height/4", 3: "width/4"}),
    # probed on 2026-11-27 as architectures nobody here had tried (slow only):
    # bottleneck layers and NoNorm (an elementwise affine instead of LayerNorm)
    _text("mobilebert", _hf("MobileBertForSequenceClassification", "MobileBertConfig", vocab_size=VOCAB,
                            max_position_embeddings=32, embedding_size=16, intra_bottleneck_size=16,
                            true_hidden_size=16, num_feedforward_networks=2, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, **_SMALL_HF)),
    # span-based dynamic convolution: kernels computed from the input, applied through an unfold
    _text("convbert", _hf("ConvBertForSequenceClassification", "ConvBertConfig", vocab_size=VOCAB,
                          max_position_embeddings=32, embedding_size=16, conv_kernel_size=3, head_ratio=1,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_SMALL_HF)),
    # grouped 1x1 Conv1d in place of the linear layers
    _text("squeezebert", _hf("SqueezeBertForSequenceClassification", "SqueezeBertConfig", vocab_size=VOCAB,
                             max_position_embeddings=32, embedding_size=16, q_groups=2, k_groups=2, v_groups=2,
                             post_attention_groups=2, intermediate_groups=2, output_groups=2,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_SMALL_HF)),
    # token mixing by a 2D Fourier transform (DFT); TorchScript cannot export it, the dynamo exporter can
    _text("fnet", _hf("FNetForSequenceClassification", "FNetConfig", vocab_size=VOCAB, max_position_embeddings=32,
                      hidden_size=16, num_hidden_layers=2, intermediate_size=32, hidden_dropout_prob=0.0,
                      num_labels=CLASSES, use_tpu_fourier_optimizations=False)),
    # ALiBi position biases computed from the attention mask
    _text("bloom", _hf("BloomForSequenceClassification", "BloomConfig", vocab_size=VOCAB, hidden_size=16,
                       n_layer=2, n_head=2, hidden_dropout=0.0, attention_dropout=0.0, num_labels=CLASSES,
                       pad_token_id=0)),
    # grouped-query attention with biased projections, RMSNorm, SwiGLU, rotary embeddings
    _text("qwen2", _hf("Qwen2ForSequenceClassification", "Qwen2Config", vocab_size=VOCAB, hidden_size=16,
                       intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       max_position_embeddings=32, num_labels=CLASSES, pad_token_id=0,
                       attn_implementation="eager")),
    # parallel attention and MLP residuals, partial rotary embeddings
    _text("gpt_neox", _hf("GPTNeoXForSequenceClassification", "GPTNeoXConfig", vocab_size=VOCAB, hidden_size=16,
                          intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=32,
                          num_labels=CLASSES, pad_token_id=0, attn_implementation="eager", hidden_dropout=0.0,
                          attention_dropout=0.0)),
    # position embeddings interpolated (bicubic) to the input size; LayerScale
    _vision("dinov2", "transformers", _hf("Dinov2ForImageClassification", "Dinov2Config", hidden_size=16,
                                          num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
                                          num_labels=CLASSES, mlp_ratio=2), sizes=(32, 48)),
    # relative position bias tables; the image size is fixed by them
    _vision("beit", "transformers", _hf("BeitForImageClassification", "BeitConfig", image_size=32, patch_size=8,
                                        use_relative_position_bias=True, drop_path_rate=0.0, **_SMALL_HF),
            sizes=(32, None), axes={}),
    _vision("clip_vision", "transformers", clip_vision, sizes=(32, None), axes={}),
    Spec("lraspp", "torchvision", lraspp, _image, _full_size_pixel_classes, (64, 96), IMAGE_AXES,
         output_axes=IMAGE_AXES),
    Spec("r3d_18", "torchvision", r3d_18, _video, _classes, (32, 48), {3: "height", 4: "width"}, batches=(2, 3)),
    # weight standardization: every convolution normalizes its own weights in the forward
    _vision("nf_resnet26", "timm", _timm("nf_resnet26")),
    # mixed kernel sizes on channel splits
    _vision("mixnet_s", "timm", _timm("mixnet_s")),
    # split attention: a softmax over grouped convolution branches
    _vision("resnest14d", "timm", _timm("resnest14d")),
    # re-parameterizable branches (train-time form)
    _vision("repvit_m0_9", "timm", _timm("repvit_m0_9")),
    _vision("fastvit_t8", "timm", _timm("fastvit_t8")),
    # convolutions and cross-covariance attention mixed
    _vision("edgenext_xx_small", "timm", _timm("edgenext_xx_small")),
    _vision("lcnet_050", "timm", _timm("lcnet_050")),
    # parallel resolutions joined by strided convolutions and nearest upsampling
    _vision("hrnet_w18_small", "timm", _timm("hrnet_w18_small")),
    # probed on 2026-11-27 (session 14) as architectures nobody here had tried (slow only):
    # partial rotary embeddings, parallel attention and MLP, a LayerNorm shared by both
    _text("phi", _hf("PhiForSequenceClassification", "PhiConfig", vocab_size=VOCAB, max_position_embeddings=32,
                     pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, partial_rotary_factor=0.5,
                     attn_implementation="eager", **_SMALL_HF)),
    _text("roformer", roformer),
    # relative position buckets shared by every layer's attention
    _text("mpnet", _hf("MPNetForSequenceClassification", "MPNetConfig", vocab_size=VOCAB, max_position_embeddings=40,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_SMALL_HF)),
    # rotary embeddings on a BERT-style encoder, token dropout rescaling of the embeddings
    _text("esm", _hf("EsmForSequenceClassification", "EsmConfig", vocab_size=VOCAB, max_position_embeddings=40,
                     pad_token_id=1, position_embedding_type="rotary", hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, **_SMALL_HF)),
    # learned positions offset by 2, computed from the attention mask by a cumulative sum
    _text("opt", _hf("OPTForSequenceClassification", "OPTConfig", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                     ffn_dim=32, num_attention_heads=2, max_position_embeddings=32, word_embed_proj_dim=16, dropout=0.0,
                     attention_dropout=0.0, pad_token_id=1, num_labels=CLASSES, attn_implementation="eager")),
    # multi-query attention: one key/value head broadcast over the query heads
    _text("gpt_bigcode", _hf("GPTBigCodeForSequenceClassification", "GPTBigCodeConfig", vocab_size=VOCAB, n_embd=16,
                             n_layer=2, n_head=2, n_positions=32, multi_query=True, resid_pdrop=0.0, embd_pdrop=0.0,
                             attn_pdrop=0.0, pad_token_id=0, num_labels=CLASSES, attn_implementation="eager")),
    # ALiBi: both exports are models onnxruntime cannot run (expected_failures.py), and the errors say so
    _text("falcon", _hf("FalconForSequenceClassification", "FalconConfig", vocab_size=VOCAB, hidden_size=16,
                        num_hidden_layers=2, num_attention_heads=2, pad_token_id=0, hidden_dropout=0.0,
                        attention_dropout=0.0, num_labels=CLASSES, alibi=True, attn_implementation="eager")),
    # global response normalization (an L2 norm over the spatial axes, divided by its channel mean)
    _vision("convnextv2", "transformers", _hf("ConvNextV2ForImageClassification", "ConvNextV2Config",
                                              hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_labels=CLASSES,
                                              drop_path_rate=0.0)),
    # wav2vec2's feature encoder and weight-normalized positional convolution, an attention-pooled head
    Spec("hubert", "transformers", _hf("HubertForSequenceClassification", "HubertConfig", conv_dim=(8, 8),
                                       conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                       num_conv_pos_embedding_groups=2, feat_proj_dropout=0.0, activation_dropout=0.0,
                                       final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, classifier_proj_size=8,
                                       hidden_dropout=0.0, attention_dropout=0.0, **_SMALL_HF),
         _audio, _classes, (400, 640), {1: "samples"}, batches=(2, 3)),
    # talking-heads attention, LayerScale, class-attention layers; the position embedding fixes the size
    _vision("cait", "timm", _timm("cait_xxs24_224", img_size=32, embed_dim=16, depth=2, num_heads=2, depth_token_only=1,
                                  drop_path_rate=0.0), sizes=(32, None), axes={}),
    # pooling between transformer stages by a strided depthwise convolution over the token grid
    _vision("pit", "timm", _timm("pit_ti_224", img_size=64), sizes=(64, None), axes={}),
    # universal inverted bottlenecks (optional depthwise convolutions before and after the expansion)
    _vision("mobilenetv4", "timm", _timm("mobilenetv4_conv_small")),
    # learnable affine blocks (a scale and a bias per activation), ESE attention
    _vision("hgnetv2", "timm", _timm("hgnetv2_b0")),
    # partial convolution: a 3x3 convolution on a channel slice, concatenated with the rest
    _vision("fasternet", "timm", _timm("fasternet_t0")),
    # gated CNN blocks: a depthwise convolution on a channel split, multiplied by a gate
    _vision("mambaout", "timm", _timm("mambaout_femto", drop_path_rate=0.0)),
    # spatial-reduction attention (keys and values from a strided convolution), depthwise convolution in the MLP
    _vision("pvt_v2", "timm", _timm("pvt_v2_b0", drop_path_rate=0.0)),
    # cascaded group attention with attention biases gathered for a fixed resolution
    _vision("efficientvit_m0", "timm", _timm("efficientvit_m0", img_size=64), sizes=(64, None), axes={}),
    # gated positional self-attention (a learned mix of content and position attention)
    _vision("convit", "timm", _timm("convit_tiny", img_size=32, depth=2, drop_path_rate=0.0), sizes=(32, None),
            axes={}),
    # DFC attention: a gate from horizontal and vertical depthwise convolutions on a pooled map, upsampled
    _vision("ghostnetv2", "timm", _timm("ghostnetv2_100")),
    # torchvision's own ConvNeXt: LayerNorm over channels through permutes, LayerScale
    _vision("convnext_tiny", "torchvision", _torchvision("convnext_tiny", stochastic_depth_prob=0.0)),
    # rotary embeddings over the 2-D patch grid, SwiGLU; timm's TorchScript path cannot be exported
    _vision("eva02", "timm", _timm("eva02_tiny_patch14_224", img_size=56, depth=2, drop_path_rate=0.0),
            sizes=(56, None), axes={}),
    # the MLP-Mixer family: MLPs across the patch axis, whose count fixes the image size
    _vision("mixer", "timm", _mlp_mixer("mixer"), sizes=(64, None), axes={}),
    _vision("resmlp", "timm", _mlp_mixer("resmlp"), sizes=(64, None), axes={}),
    _vision("gmlp", "timm", _mlp_mixer("gmlp"), sizes=(64, None), axes={}),
    # window attention with padding to a multiple of the window, convolutional MBConv stages
    _vision("tiny_vit", "timm", _timm("tiny_vit_5m_224", drop_path_rate=0.0)),
    # inception branches concatenated, max pools with ceil_mode
    _vision("googlenet", "torchvision", _torchvision("googlenet", aux_logits=False, init_weights=True, dropout=0.0)),
    # factorized 1x7 / 7x1 convolutions, BatchNorm with eps 1e-3; at 96 px its last blocks see 1x1 maps, and
    # training-mode BatchNorm over 3 values per channel puts even torch's float32 loss 1e-3 off its float64 one
    _vision("inception_v3", "torchvision", _torchvision("inception_v3", aux_logits=False, init_weights=True,
                                                        dropout=0.0), sizes=(128, 160)),
    # torch.nn recurrences with a sequence length known only at run time (each direction is a Scan)
    Spec("lstm_bidirectional", "torch", _recurrent("LSTM", num_layers=2, bidirectional=True), _tokens, _classes,
         (8, 12), SEQUENCE_AXES, batches=(2, 3)),
    Spec("gru", "torch", _recurrent("GRU", num_layers=2), _tokens, _classes, (8, 12), SEQUENCE_AXES, batches=(2, 3)),
    Spec("rnn_relu", "torch", _recurrent("RNN", nonlinearity="relu"), _tokens, _classes, (8, 12), SEQUENCE_AXES,
         batches=(2, 3)),
    # probed on 2026-11-28 (session 19) with padded attention masks, token types and opsets 14-18 besides
    # (/tmp/probe19_nlp); here in the zoo's single-input form (slow only):
    # factorized embeddings projected to the hidden size
    _text("electra", _hf("ElectraForSequenceClassification", "ElectraConfig", vocab_size=VOCAB, embedding_size=8,
                         max_position_embeddings=32, **_TRANSFORMER)),
    # BERT with integer-only kernels switched off (quant_mode=False): its float GELU, softmax and LayerNorm
    _text("ibert", _hf("IBertForSequenceClassification", "IBertConfig", vocab_size=VOCAB, max_position_embeddings=40,
                       pad_token_id=1, quant_mode=False, **_TRANSFORMER)),
    # grouped-query attention with a sliding window, RMSNorm, SwiGLU
    _text("mistral", _hf("MistralForSequenceClassification", "MistralConfig", vocab_size=VOCAB, hidden_size=16,
                         intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         sliding_window=4, max_position_embeddings=32, num_labels=CLASSES, pad_token_id=0,
                         attn_implementation="eager")),
    # RMSNorm by (1 + weight), embeddings scaled by sqrt(hidden), GELU-gated MLP
    _text("gemma", _hf("GemmaForSequenceClassification", "GemmaConfig", head_dim=8, **_SMALL_DECODER)),
    # rotary embeddings on interleaved pairs (rotate_every_two) over part of each head, parallel attention and MLP
    _text("gptj", _hf("GPTJForSequenceClassification", "GPTJConfig", vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2,
                      rotary_dim=4, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0,
                      num_labels=CLASSES)),
    # ALiBi biases computed once for the longest sequence and sliced to the input's, no position embeddings
    _text("mpt", _hf("MptForSequenceClassification", "MptConfig", vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2,
                     max_seq_len=32, expansion_ratio=2, pad_token_id=0, num_labels=CLASSES)),
    # partial rotary embeddings with LayerNorm (not RMSNorm) and SwiGLU
    _text("stablelm", _hf("StableLmForSequenceClassification", "StableLmConfig", vocab_size=VOCAB, hidden_size=16,
                          intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          partial_rotary_factor=0.5, max_position_embeddings=32, num_labels=CLASSES,
                          pad_token_id=0, attn_implementation="eager")),
    # fused QKV and gate/up projections split by slices, RMSNorm
    _text("phi3", _hf("Phi3ForSequenceClassification", "Phi3Config", vocab_size=VOCAB, hidden_size=16,
                      intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=32, num_labels=CLASSES, pad_token_id=0, attn_implementation="eager")),
    # probed on 2026-11-28 (session 20) as architectures nobody here had tried, with the TorchScript (training
    # mode) and dynamo exporters (/tmp/gp/h_arch; slow only):
    # two-stream relative attention (content and query streams), relative position encodings, einsum everywhere
    _text("xlnet", _hf("XLNetForSequenceClassification", "XLNetConfig", vocab_size=VOCAB, d_model=16, n_layer=2,
                       n_head=2, d_inner=32, dropout=0.0, num_labels=CLASSES, summary_last_dropout=0.0)),
    # BigBird with full attention (its block-sparse form needs sequences of many blocks)
    _text("big_bird", _hf("BigBirdForSequenceClassification", "BigBirdConfig", vocab_size=VOCAB,
                          max_position_embeddings=64, attention_type="original_full", hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, **_SMALL_HF)),
    # cross-attention from learned latents to the bytes; the byte positions fix the length
    Spec("perceiver", "transformers", perceiver, _bytes, _classes, (8, None), {}, batches=(2, 3)),
    # video: a Conv3d tubelet embedding, frames-first input
    Spec("videomae", "transformers", videomae, _frames, _classes, (32, None), {}, batches=(2, 3)),
    # random masking made deterministic: an argsort (TopK) of per-patch noise, a Gather of the kept patches
    _vision("vit_mae", "transformers", vit_mae, sizes=(32, None), axes={}),
    # both CLIP towers and the learned temperature (a 0-d parameter, which requires_grad=None does not train in a
    # TorchScript export: expected_failures.py)
    _vision("clip", "transformers", _two_towers("CLIPModel", "CLIPConfig"), sizes=(32, None), axes={}),
    # SigLIP: both towers, a learned temperature and bias, an attention-pooling head
    _vision("siglip", "transformers", _two_towers("SiglipModel", "SiglipConfig"), sizes=(32, None), axes={}),
    # depth decoder on a SegFormer encoder: Resizes by constant scales joined to the encoder's maps
    Spec("glpn", "transformers", _depth_classes, _image, _full_size_pixel_classes, (64, 96), IMAGE_AXES,
         output_axes=IMAGE_AXES, batches=(2, 3)),
    # a ViT reassembled into a pyramid by transposed and strided convolutions; the position embedding fixes the size
    Spec("dpt", "transformers", dpt, _image, _double_size_pixel_classes, (32, None), {}, batches=(2, 3)),
    # detection tokens and position embeddings interpolated (bicubic) to the input size
    Spec("yolos", "transformers", _detection_tokens, _image, _token_classes, (32, 48), IMAGE_AXES, batches=(2, 3)),
    # torchvision's ViT at a tiny width (class token, its own MLP block layout)
    _vision("vit_tv", "torchvision", _torchvision_direct("torchvision.models.vision_transformer", "VisionTransformer",
                                                         image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                         hidden_dim=16, mlp_dim=32), sizes=(32, None), axes={}),
    # torchvision's MaxViT: MBConv, block and grid attention with relative position bias over 2x2 partitions
    _vision("maxvit_t", "torchvision", _torchvision_direct("torchvision.models.maxvit", "MaxVit", input_size=(64, 64),
                                                           stem_channels=16, partition_size=2, block_channels=[16, 32],
                                                           block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.0),
            sizes=(64, None), axes={}),
    # atrous spatial pyramid pooling, a pooled branch upsampled to the map, logits upsampled to the input
    Spec("deeplabv3", "torchvision", deeplabv3, _image, _full_size_pixel_classes, (64, 96), IMAGE_AXES,
         output_axes=IMAGE_AXES, batches=(2, 3)),
    # SSDlite's classification head over six feature maps, flattened and concatenated per anchor
    Spec("ssdlite", "torchvision", ssdlite, _image, _anchor_classes, (64, 96), IMAGE_AXES, output_axes={2: "anchors"},
         batches=(2, 3)),
    # inception depthwise convolutions on channel splits (square, 1x11 and 11x1 bands, identity)
    _vision("inception_next", "timm", _timm("inception_next_tiny", depths=(1, 1, 1, 1), dims=(16, 32, 32, 32),
                                            drop_path_rate=0.0)),
    # outlook attention: attention weights per window from a Linear, applied through Unfold and Fold (col2im)
    _vision("volo", "timm", _timm_direct("timm.models.volo", "VOLO", layers=(1, 1, 1, 1), img_size=64,
                                         embed_dims=(32, 64, 64, 64), num_heads=(1, 2, 2, 2)),
            sizes=(64, None), axes={}),
    # bidirectional LSTMs along the rows and along the columns of the token grid
    _vision("sequencer2d", "timm", _timm("sequencer2d_s", layers=(1, 1, 1, 1), embed_dims=(16, 32, 32, 32),
                                         hidden_sizes=(8, 16, 16, 16), drop_path_rate=0.0), sizes=(64, 96)),
    # dual attention: spatial windows padded to a multiple of the window (F.pad with pads computed at run time) and
    # channel attention; the dynamo export takes more than 7 minutes, so only TorchScript runs
    _vision("davit", "timm", _timm("davit_tiny", depths=(1, 1, 1, 1), embed_dims=(16, 32, 32, 32),
                                   num_heads=(1, 2, 2, 2), drop_path_rate=0.0), skip=("dynamo",)),
    # nested hierarchical transformer: attention within blocks, aggregated by convolution and max pooling
    _vision("nest", "timm", _timm_direct("timm.models.nest", "Nest", img_size=64, patch_size=4,
                                         embed_dims=(16, 32, 32), num_heads=(1, 2, 2), depths=(1, 1, 1)),
            sizes=(64, None), axes={}),
    # global context attention (queries from a pooled global token), window attention
    _vision("gcvit", "timm", _timm("gcvit_xxtiny", img_size=64, window_size=(2, 2, 2, 1), drop_path_rate=0.0),
            sizes=(64, None), axes={}),
    # two branches of different patch sizes exchanging class tokens by cross-attention
    _vision("crossvit", "timm", _timm("crossvit_tiny_240", img_size=120, drop_path_rate=0.0), sizes=(120, None),
            axes={}),
    # convolutional stages then transformer stages with BatchNorm in place of LayerNorm
    _vision("visformer", "timm", _timm("visformer_tiny", img_size=64, drop_path_rate=0.0), sizes=(64, None),
            axes={}),
    # text with a box per token (x, y, width and height embeddings), packed with the ids into one input
    Spec("layoutlmv3", "transformers", layoutlmv3, _words_and_boxes, _classes, (8, 12), SEQUENCE_AXES, batches=(2, 3)),
    # convolutional projections with BatchNorm over the token grid; the dynamo export splits by run-time sizes
    _vision("cvt", "transformers", cvt),
    Spec("mc3_18", "torchvision", mc3_18, _video, _classes, (32, 48), {3: "height", 4: "width"}, batches=(2, 3)),
    # serial and parallel blocks with convolutional relative position encoding (factorized attention)
    _vision("coat", "timm", _timm("coat_lite_tiny", img_size=64, drop_path_rate=0.0), sizes=(64, None), axes={}),
    # attention with a talking-heads mix and a strided local downsampling of the queries, BatchNorm everywhere;
    # the attention biases fix the size
    _vision("efficientformerv2", "timm", _timm("efficientformerv2_s0", img_size=64, drop_path_rate=0.0),
            sizes=(64, None), axes={}),
    # locally grouped attention over windows (padded to a multiple of the window) and global sub-sampled
    # attention, convolutional position encodings
    _vision("twins_svt", "timm", _timm("twins_svt_small", img_size=64, depths=(1, 1, 1, 1), drop_path_rate=0.0)),
    # timm's MaxViT (MBConv with BatchNorm, then block and grid attention with relative position biases, which
    # fix the size); two stages of one block. Running means after one training step: 1e-7 (relative) from torch
    # float64, as torch float32's; the float64 graph 2e-8 (momentum and epsilon are float32 attributes). From timm's
    # own init (BatchNorm bias 0), conv.norm1's batch mean is W @ 0 = 0: both values are rounding noise (1e-8), whose
    # relative difference says nothing; the zoo's perturbed weights avoid that
    _vision("maxvit_rw", "timm", _timm("maxvit_nano_rw_256", img_size=64, embed_dim=(16, 32), depths=(1, 1),
                                       block_type=("M", "M"), stem_width=(8, 16), transformer_dim_head=8,
                                       drop_path_rate=0.0), sizes=(64, None), axes={}),
    # ReLU kinks and training-mode BatchNorm3d over 8 to 18 values per channel in the last blocks: float32 gradients
    # up to 3e-2 off on some batches (torch float32 1e-4), while the graph run in float64 is within 4e-8 of torch
    # float64 (4e-12 with torch's eps rounded to the float32 attribute's 0.0010000000475); torch float64's own
    # gradients move by 5e-2 when the input moves by float32 rounding (eval mode), so the float64 check decides
    Spec("s3d", "torchvision", s3d, _video8, _classes, (64, 96), {3: "height", 4: "width"}, batches=(2, 3)),
    # probed on 2026-11-29 (session 21) as architectures nobody here had tried (slow only):
    # weight standardization in the forward (StdConv2d), GroupNorm, pre-activation bottlenecks
    _vision("resnetv2_bit", "timm", resnetv2_bit),
    # halo attention: keys and values from each 2x2 block with a 1-pixel halo (unfold of the padded map), relative
    # position logits over the window
    _vision("halonet26t", "timm", _byob("halonet26t", _BYOA, block_size=2, halo_size=1), sizes=(64, 128)),
    # bottleneck self-attention with relative position logits for a fixed feature size
    _vision("botnet26t", "timm", _byob("botnet26t", _BYOA), sizes=(64, None), axes={}),
    # lambda layers: content lambdas from softmax-normalized keys, position lambdas from a Conv3d over the values
    _vision("lambda_resnet26t", "timm", _byob("lambda_resnet26t", _BYOA)),
    # selective kernel: 3x3 and dilated branches mixed by a softmax attention over branches
    _vision("skresnet18", "timm", _timm("skresnet18", layers=(1, 1, 1, 1), channels=(16, 32, 64, 64), stem_width=16)),
    # space-to-depth stem, anti-aliased (blur) downsampling, inplace-ABN-style LeakyReLU, SE
    _vision("tresnet_m", "timm", _timm("tresnet_m", layers=(1, 1, 1, 1), width_factor=0.25)),
    # MobileOne and RepVGG in their training form: parallel 3x3, 1x1 and identity BatchNorm branches summed.
    # MobileOne's depthwise 1x1 branch scales each channel before a training-mode BatchNorm, so its weights' gradient
    # exists only through epsilon (1e-6 to 1e-5 of the gradient's norm): float32 sums make it noise, in torch (1e-3)
    # and more so in onnxruntime's float32 reductions (2e-2 to 4e-2). The float64 graph matches torch float64 within
    # 1e-10 once both use the same epsilon: hence _float32_eps
    _vision("mobileone_s0", "timm", _float32_eps(_byob("mobileone_s0"))),
    _vision("repvgg_a0", "timm", _byob("repvgg_a0")),
    # deep layer aggregation: tree-structured roots concatenating the outputs of several levels
    _vision("dla34", "timm", _timm("dla34", levels=(1, 1, 1, 1, 1, 1), channels=(8, 16, 16, 32, 32, 64))),
    # Res2Net: each bottleneck's channels split in 8 groups, each 3x3 convolution fed the previous group's output
    _vision("res2net50_14w_8s", "timm", _timm("res2net50_14w_8s", layers=(1, 1, 1, 1), channels=(16, 32, 64, 64),
                                              stem_width=16)),
    # ReXNet: channels growing linearly, residual adds into a slice of the channels (zero-padded shortcut), SiLU
    _vision("rexnet_100", "timm", _timm("rexnet_100", width_mult=0.5, depth_mult=0.5)),
    # cross-stage partial stages (half the channels through the blocks, concatenated back)
    _vision("cspresnet50", "timm", cspresnet),
    # one-shot aggregation (every layer's output concatenated once), depthwise, effective squeeze-excitation
    _vision("ese_vovnet19b_dw", "timm", _timm_cfg("timm.models.vovnet", "VovNet", "ese_vovnet19b_dw",
                                                  stem_chs=[16, 16, 16], stage_conv_chs=[16, 16, 24, 24],
                                                  stage_out_chs=[32, 48, 64, 64])),
    # fused MBConv early, MBConv with squeeze-excitation later
    _vision("efficientnetv2_rw_t", "timm", efficientnetv2_rw_t),
    # full seq2seq: decoder input shifted from the encoder input, causal self-attention, cross-attention, tied head
    _text("bart", bart, labels=_same_tokens, output_axes={2: "sequence"}),
    # the sequence pooled (stride 2) between blocks, relative positional attention with separated token types
    _text("funnel", _hf("FunnelForSequenceClassification", "FunnelConfig", vocab_size=VOCAB, block_sizes=[1, 1],
                        num_decoder_layers=1, d_model=16, n_head=2, d_head=8, d_inner=32, hidden_dropout=0.0,
                        attention_dropout=0.0, activation_dropout=0.0, num_labels=CLASSES)),
    # DeBERTa v1: disentangled attention (content-to-position and position-to-content, gathered by relative index)
    _text("deberta_v1", _hf("DebertaForSequenceClassification", "DebertaConfig", vocab_size=VOCAB,
                            max_position_embeddings=32, relative_attention=True, max_relative_positions=16,
                            pos_att_type=["c2p", "p2c"], pooler_dropout=0.0, **_TRANSFORMER)),
    # Nystrom attention: landmarks by segment means, an iterative Moore-Penrose pseudo-inverse, a depthwise Conv2d
    # skip over the values; the segments' length is configured (segment_means_seq_len), which fixes the length
    Spec("nystromformer", "transformers", _hf("NystromformerForSequenceClassification", "NystromformerConfig",
                                              vocab_size=VOCAB, max_position_embeddings=40, num_landmarks=4,
                                              segment_means_seq_len=8, conv_kernel_size=3, hidden_dropout_prob=0.0,
                                              attention_probs_dropout_prob=0.0, **_SMALL_HF),
         _tokens, _classes, (8, None), {}, batches=(2, 3)),
    # characters hashed into several embedding tables (modulo arithmetic on the ids), a strided Conv1d downsampling,
    # local attention, upsampling by repeat
    _text("canine", _hf("CanineForSequenceClassification", "CanineConfig", downsampling_rate=4, num_hash_functions=2,
                        num_hash_buckets=64, local_transformer_stride=4, max_position_embeddings=64,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_SMALL_HF)),
    # Swin V2: cosine attention with a learned, clamped log temperature, continuous position bias from an MLP over
    # log-spaced offsets, post-norm
    _vision("swinv2", "transformers", _hf("Swinv2ForImageClassification", "Swinv2Config", image_size=32, patch_size=2,
                                          embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
                                          drop_path_rate=0.0, hidden_dropout_prob=0.0,
                                          attention_probs_dropout_prob=0.0, num_labels=CLASSES), sizes=(32, 64)),
    # focal modulation: gated aggregation of depthwise-convolution contexts at several levels and a global one
    _vision("focalnet", "transformers", _hf("FocalNetForImageClassification", "FocalNetConfig", image_size=32,
                                            patch_size=4, embed_dim=16, depths=[1, 1], focal_levels=[2, 2],
                                            focal_windows=[3, 3], drop_path_rate=0.0, hidden_dropout_prob=0.0,
                                            num_labels=CLASSES), sizes=(32, 64)),
    # raw audio: a Conv1d feature encoder with LayerNorm, a stack of grouped positional convolutions
    Spec("data2vec_audio", "transformers", _hf("Data2VecAudioForSequenceClassification", "Data2VecAudioConfig",
                                               conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                                               num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2,
                                               conv_pos_kernel_size=5, hidden_dropout=0.0, attention_dropout=0.0,
                                               activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
                                               layerdrop=0.0, mask_time_prob=0.0, mask_feature_prob=0.0,
                                               classifier_proj_size=8, **_SMALL_HF),
         _audio, _classes, (400, 640), {1: "samples"}, batches=(2, 3)),
    # a ViT over overlapping spectrogram patches (stride 10 of 16), distillation token; positions fix the length
    Spec("ast", "transformers", _hf("ASTForAudioClassification", "ASTConfig", num_mel_bins=16, max_length=32,
                                    frequency_stride=10, time_stride=10, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0, **_SMALL_HF),
         _spectrogram, _classes, (32, None), {}, batches=(2, 3)),
    # sliding-window attention over chunks (windows of 4), global attention on the first token
    _text("longformer", _hf("LongformerForSequenceClassification", "LongformerConfig", vocab_size=VOCAB,
                            max_position_embeddings=40, pad_token_id=1, attention_window=[4, 4], **_TRANSFORMER)),
    # probed on 2026-11-29 (second sweep) as families nobody here had tried (slow only; diffusers and
    # segmentation-models-pytorch are no test extras: their tests skip without them):
    # nn.TransformerEncoder with a key padding mask (torch's eval fast path: nested tensors)
    Spec("torch_transformer_encoder", "torch", torch_transformer_encoder, _padded_tokens, _classes, (8, 12),
         SEQUENCE_AXES, batches=(2, 3)),
    # a causal mask built from the length each forward, and a key padding mask
    Spec("torch_causal_lm", "torch", torch_causal_lm, _padded_tokens, _next_tokens, (8, 12), SEQUENCE_AXES,
         batches=(2, 3), output_axes={2: "positions"}),
    # nn.Transformer: encoder, causal decoder, cross-attention
    Spec("torch_seq2seq", "torch", torch_seq2seq, _tokens, _same_tokens, (8, 12), SEQUENCE_AXES, batches=(2, 3),
         output_axes={2: "sequence"}),
    # F.scaled_dot_product_attention(is_causal=True)
    Spec("sdpa_causal_lm", "torch", sdpa_causal_lm, _tokens, _next_tokens, (8, 12), SEQUENCE_AXES, batches=(2, 3),
         output_axes={2: "positions"}),
    # ConvTranspose2d, InstanceNorm2d, Tanh
    Spec("gan_generator", "torch", gan_generator, _latent_map, _scaled_pixel_classes(4), (4, 6), IMAGE_AXES,
         output_axes={2: "4*height", 3: "4*width"}),
    # PixelShuffle (DepthToSpace)
    Spec("espcn", "torch", espcn, _image, _double_size_pixel_classes, (16, 24), IMAGE_AXES,
         output_axes={2: "2*height", 3: "2*width"}),
    # F.affine_grid + F.grid_sample
    _vision("spatial_transformer", "torch", spatial_transformer, sizes=(32, 48)),
    # F.interpolate(bilinear, align_corners=True) to the skip connection's size
    Spec("unet_bilinear", "torch", unet_bilinear, _image, _full_size_pixel_classes, (32, 48), IMAGE_AXES,
         output_axes=IMAGE_AXES),
    # dilated causal Conv1d, weight_norm parametrization
    Spec("tcn", "torch", tcn, _mel, _classes, (16, 24), {2: "time"}),
    Spec("embedding_bag", "torch", embedding_bag, _tokens, _classes, (8, 12), SEQUENCE_AXES),
    # LocalResponseNorm, cumsum, einsum
    _vision("tensor_ops", "torch", tensor_ops, sizes=(20, 28)),
    # adaptive pooling to a size that does not divide the input's
    _vision("adaptive_pool_uneven", "torch", adaptive_pool_uneven, sizes=(20, 28)),
    # reparameterization with the noise as an input
    Spec("vae_head", "torch", vae_head, _features_and_noise, _classes, (24, None), {}),
    Spec("diffusers_unet2d", "diffusers", diffusers_unet2d, _noisy_image_and_timestep, _full_size_pixel_classes,
         (16, 24), IMAGE_AXES, batches=(2, 3), output_axes=IMAGE_AXES),
    Spec("diffusers_vae_encoder", "diffusers", diffusers_vae_encoder, _image, _scaled_pixel_classes(0.5), (16, 24),
         IMAGE_AXES, batches=(2, 3), output_axes={2: "height/2", 3: "width/2"}),
    Spec("smp_unet", "segmentation_models_pytorch", _smp("Unet", "resnet18", encoder_depth=3,
                                                         decoder_channels=(16, 8, 8)),
         _image, _full_size_pixel_classes, (32, 48), IMAGE_AXES, batches=(2, 3), output_axes=IMAGE_AXES),
    Spec("smp_fpn", "segmentation_models_pytorch", _smp("FPN", "mobilenet_v2", decoder_pyramid_channels=32,
                                                        decoder_segmentation_channels=32, decoder_dropout=0.0),
         _image, _full_size_pixel_classes, (64, 96), IMAGE_AXES, batches=(2, 3), output_axes=IMAGE_AXES),
    # probed on 2026-11-29 (session 25): rotary embeddings, GeGLU, alternating global and sliding-window attention
    _text("modernbert", _hf("ModernBertForSequenceClassification", "ModernBertConfig", vocab_size=VOCAB,
                            max_position_embeddings=32, pad_token_id=0, global_attn_every_n_layers=2,
                            local_attention=4, embedding_dropout=0.0, attention_dropout=0.0, mlp_dropout=0.0,
                            classifier_dropout=0.0, attn_implementation="eager", reference_compile=False,
                            **_SMALL_HF)),
    # RMSNorm of each head's queries and keys (QK-norm), grouped-query attention
    _text("qwen3", _hf("Qwen3ForSequenceClassification", "Qwen3Config", head_dim=8, **_SMALL_DECODER)),
    # a mixture of experts: a softmax router, top-2 experts per token, each token's expert weights gathered
    # (transformers' batched_mm experts: its default grouped_mm counts tokens per expert with torch.histc, which
    # neither exporter writes)
    _text("qwen3_moe", _hf("Qwen3MoeForSequenceClassification", "Qwen3MoeConfig", moe_intermediate_size=16,
                           num_experts=4, num_experts_per_tok=2, head_dim=8, experts_implementation="batched_mm",
                           **_SMALL_DECODER)),
    # normalization after attention and MLP (not before), QK-norm over the whole projection
    _text("olmo2", _hf("Olmo2ForSequenceClassification", "Olmo2Config", **_SMALL_DECODER)),
    # layers without position embeddings (NoPE) between rotary ones
    _text("smollm3", _hf("SmolLM3ForSequenceClassification", "SmolLM3Config", no_rope_layer_interval=2,
                         **_SMALL_DECODER)),
    # a hierarchical ViT with mask-unit attention and unrolled patches (no relative positions)
    _vision("hiera", "transformers", _hf("HieraForImageClassification", "HieraConfig", embed_dim=8,
                                         image_size=[64, 64], patch_size=[7, 7], patch_stride=[4, 4],
                                         patch_padding=[3, 3], depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2],
                                         num_labels=CLASSES, drop_path_rate=0.0), sizes=(64, None), axes={}),
    # sliding-window layers between global ones, QK-norm, RMSNorm by (1 + weight) around attention and MLP
    _text("gemma3_text", _hf("Gemma3TextForSequenceClassification", "Gemma3TextConfig", head_dim=8, sliding_window=4,
                             **_SMALL_DECODER)),
    # element-wise products of two branches ("star" operation), depthwise convolutions with BatchNorm
    _vision("starnet_s1", "timm", _timm("starnet_s1")),
    # re-parameterizable ghost modules: a BatchNorm identity branch beside a depthwise convolution in training
    _vision("repghostnet_050", "timm", _timm("repghostnet_050")),
    # probed on 2026-11-29 (session 26): PatchTST (patches of a time series per channel, mean/std scaling,
    # training-mode BatchNorm between attention and feed-forward, sinusoidal positions of a fixed number of patches)
    Spec("patchtst", "transformers", patchtst, _series, _classes, (32, None), {}),
    # PatchTSMixer: MLPs across patches, features and channels with gated attention, max-pooled head
    Spec("patchtsmixer", "transformers", _hf_field("PatchTSMixerForTimeSeriesClassification", "PatchTSMixerConfig",
                                                   "prediction_outputs", num_input_channels=2, context_length=32,
                                                   patch_length=8, patch_stride=8, d_model=16, num_layers=2,
                                                   mode="mix_channel", dropout=0.0, head_dropout=0.0,
                                                   num_targets=CLASSES),
         _series, _classes, (32, None), {}),
    # Speech2Text's encoder: two strided Conv1d + GLU subsampling the filterbank frames, sinusoidal positions
    Spec("speech2text", "transformers", _pooled_encoder("Speech2TextModel", "Speech2TextConfig", 16,
                                                        vocab_size=VOCAB, d_model=16, encoder_layers=2,
                                                        encoder_attention_heads=2, encoder_ffn_dim=32,
                                                        decoder_layers=1, decoder_attention_heads=2,
                                                        decoder_ffn_dim=32, conv_channels=16,
                                                        conv_kernel_sizes=(5, 5), input_feat_per_channel=8,
                                                        max_source_positions=64, max_target_positions=32,
                                                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                                                        encoder_layerdrop=0.0),
         _filterbank, _classes, (24, 40), {1: "frames"}, batches=(2, 3)),
    # WavLM: wav2vec2's feature encoder with a gated relative position bias (log-spaced buckets) in attention
    Spec("wavlm", "transformers", _hf("WavLMForSequenceClassification", "WavLMConfig", num_conv_pos_embeddings=4,
                                      num_conv_pos_embedding_groups=2, num_buckets=16, max_bucket_distance=32,
                                      **_SMALL_AUDIO),
         _audio, _classes, (400, 640), {1: "samples"}, batches=(2, 3)),
    # SEW: the sequence squeezed (strided positional convolution) before the encoder and upsampled after
    Spec("sew", "transformers", _hf("SEWForSequenceClassification", "SEWConfig", num_conv_pos_embeddings=4,
                                    num_conv_pos_embedding_groups=2, squeeze_factor=2, **_SMALL_AUDIO),
         _audio, _classes, (400, 640), {1: "samples"}, batches=(2, 3)),
    # SEW-D: SEW's squeezing with DeBERTa's disentangled attention (relative positions gathered by bucket)
    Spec("sew_d", "transformers", _hf("SEWDForSequenceClassification", "SEWDConfig", num_conv_pos_embeddings=4,
                                      num_conv_pos_embedding_groups=2, squeeze_factor=2, max_position_embeddings=64,
                                      position_buckets=16, **_SMALL_AUDIO),
         _audio, _classes, (400, 640), {1: "samples"}, batches=(2, 3)),
    # the Conformer: rotary attention and a convolution module (GLU, depthwise Conv1d, BatchNorm) in each block
    Spec("wav2vec2_conformer", "transformers", wav2vec2_conformer, _audio, _classes, (400, 640), {1: "samples"},
         batches=(2, 3)),
    # Moonshine's encoder (on-device speech recognition): a strided Conv1d stem over raw audio with GroupNorm,
    # rotary attention over part of each head
    Spec("moonshine", "transformers", _pooled_encoder("MoonshineModel", "MoonshineConfig", 16, vocab_size=VOCAB,
                                                      hidden_size=16, intermediate_size=32,
                                                      encoder_num_hidden_layers=2, decoder_num_hidden_layers=1,
                                                      encoder_num_attention_heads=2, decoder_num_attention_heads=2,
                                                      encoder_num_key_value_heads=2, decoder_num_key_value_heads=2,
                                                      attn_implementation="eager"),
         _audio, _classes, (2400, 3200), {1: "samples"}, batches=(2, 3)),
    # Swin2SR super-resolution: Swin V2 blocks over the full-resolution map, PixelShuffle to twice the size
    Spec("swin2sr", "transformers", _hf_field("Swin2SRForImageSuperResolution", "Swin2SRConfig", "reconstruction",
                                              image_size=16, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                              window_size=4, upscale=2, upsampler="pixelshuffledirect",
                                              num_channels_out=CLASSES, drop_path_rate=0.0),
         _image, _double_size_pixel_classes, (16, 24), IMAGE_AXES, batches=(2, 3),
         output_axes={2: "2*height", 3: "2*width"}),
    # MobileViT v2: separable self-attention (a context vector from a softmax over patches) with GroupNorm
    _vision("mobilevitv2_050", "timm", _timm("mobilevitv2_050", drop_path_rate=0.0), sizes=(64, 128)),
    # LFM2: gated short causal convolutions (Conv1d over 3 steps) between grouped-query attention layers
    _text("lfm2", lfm2, labels=_next_tokens, output_axes={2: "positions"}),
    # probed on 2026-11-29 (session 28): SwiftFormer's efficient additive attention (a softmax-free global query
    # from L2-normalized queries weighted by a learned vector, summed over tokens, times the keys)
    _vision("swiftformer_xs", "timm", _timm("swiftformer_xs", drop_path_rate=0.0)),
    # mobile multi-query attention (keys and values downsampled by a strided depthwise convolution), LayerScale
    _vision("mobilenetv4_hybrid", "timm", mobilenetv4_hybrid),
    # 2-D rotary embeddings with learned frequencies per head (mixed RoPE: gradients through Sin and Cos of a
    # parameter), computed for the input's patch grid
    _vision("vit_rope_mixed", "timm", _timm("vit_base_patch16_rope_mixed_224", img_size=32, patch_size=8,
                                            embed_dim=16, depth=2, num_heads=2, dynamic_img_size=True,
                                            drop_path_rate=0.0), sizes=(32, 48)),
    # TensorFlow "same" padding computed from the input size at run time (an asymmetric Pad before each strided
    # convolution), ReLU6
    _vision("mobilenet_v1", "transformers", _hf("MobileNetV1ForImageClassification", "MobileNetV1Config",
                                                depth_multiplier=0.25, classifier_dropout_prob=0.0,
                                                num_labels=CLASSES)),
    # DINOv3: rotary embeddings over the patch grid's normalized coordinates (computed for the input size), register
    # tokens, LayerScale; mean-pooled into a linear head (its training-mode random rescaling of the coordinates off)
    _vision("dinov3_vit", "transformers", _pooled_encoder("DINOv3ViTModel", "DINOv3ViTConfig", 16, encoder=False,
                                                          hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                                          intermediate_size=32, patch_size=8, image_size=32,
                                                          num_register_tokens=2, pos_embed_rescale=None,
                                                          drop_path_rate=0.0),
            sizes=(32, 48)),
    # differential attention: two softmax maps subtracted with a weight from exponentials of learned vectors,
    # a GroupNorm-like RMSNorm per head
    _text("diffllama", _hf("DiffLlamaForSequenceClassification", "DiffLlamaConfig",
                           **dict(_SMALL_DECODER, num_key_value_heads=2))),
    # RWKV: token shift (ZeroPad2d), a WKV recurrence with a running maximum for stability (a Python loop over the
    # positions: the length is fixed by the export), squared ReLU channel mixing; without the cache, whose state
    # eval mode updates in place (torch cannot differentiate that)
    Spec("rwkv", "transformers", _causal_lm("RwkvForCausalLM", "RwkvConfig", vocab_size=VOCAB, hidden_size=16,
                                            num_hidden_layers=2, attention_hidden_size=16, intermediate_size=32,
                                            context_length=32, rescale_every=0, use_cache=False),
         _tokens, _next_tokens, (8, None), {}, batches=(2, 3)),
    # Gemma 3n's text model (on-device): AltUp (two predicted streams corrected by a router), Laurel low-rank
    # residuals, per-layer input embeddings, activation sparsity (a Gaussian top-k: mean + 1.645 std cutoff)
    _text("gemma3n_text", _causal_lm("Gemma3nForCausalLM", "Gemma3nTextConfig", vocab_size_per_layer_input=VOCAB,
                                     hidden_size_per_layer_input=4, head_dim=8, sliding_window=4,
                                     layer_types=["sliding_attention", "full_attention"],
                                     activation_sparsity_pattern=[0.95, 0.0], num_kv_shared_layers=0,
                                     laurel_rank=4, altup_num_inputs=2, **_SMALL_LM),
          labels=_next_tokens, output_axes={2: "positions"}),
    # xLSTM's mLSTM in its chunkwise form: exponential input gates and log-sigmoid forget gates, cumulative sums
    # and running maxima within chunks of 4, soft-capped gates and logits; the recurrence between chunks is a
    # Python loop, so the export fixes the length (at 12 tokens both exports give wrong logits in onnxruntime)
    Spec("xlstm", "transformers", _causal_lm("xLSTMForCausalLM", "xLSTMConfig", vocab_size=VOCAB, hidden_size=32,
                                             num_hidden_layers=2, num_heads=2, mode="train", chunk_size=4,
                                             autocast_kernel_dtype="float32", ffn_round_up_to_multiple_of=16,
                                             use_cache=False),
         _tokens, _next_tokens, (8, None), {}, batches=(2, 3)),
    # Parakeet's FastConformer encoder (on-device speech recognition): a strided Conv2d subsampling of the
    # filterbank, relative positional attention (Transformer-XL's shift of the position scores), a convolution
    # module with GLU, a depthwise Conv1d and BatchNorm
    Spec("parakeet", "transformers", _pooled_encoder("ParakeetEncoder", "ParakeetEncoderConfig", 16, encoder=False,
                                                     hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                                     intermediate_size=32, num_mel_bins=8,
                                                     subsampling_conv_channels=8, subsampling_factor=4,
                                                     conv_kernel_size=3, dropout=0.0, attention_dropout=0.0,
                                                     activation_dropout=0.0, dropout_positions=0.0, layerdrop=0.0),
         _filterbank, _classes, (32, 48), {1: "frames"}, batches=(2, 3)),
    # efficient channel attention: a Conv1d over the pooled channel descriptor (channels as the sequence axis)
    _vision("ecaresnet26t", "timm", _timm("ecaresnet26t", layers=(1, 1, 1, 1), channels=(16, 32, 64, 64),
                                          stem_width=16)),
]}
