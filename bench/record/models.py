#!/usr/bin/env python3
"""Real PyTorch models whose tensor allocations make the trace corpus (bench/traces).

    python3 bench/record/models.py NAME      # under scripts/record-traces' recorder
    python3 bench/record/models.py --list

Each model runs on CPU a few steps of what a real job does, with shapes that change per step as
real jobs' do (batch, image size, sequence length). Weights are random (nothing is downloaded):
allocation sizes and lifetimes depend on shapes, not on values. Seeds are fixed so that a
re-recording gives the same sequence. Each step starts with gpushim_rec_mark() (the recorder's
step mark, a no-op without it), and the model and its optimizer are released at the end.
"""
import ctypes
import random
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision


def _mark_fn():
    try:
        return ctypes.CDLL(None).gpushim_rec_mark
    except AttributeError:
        return lambda: None


def cnn_train(mark, rng):
    """ResNet-18 training (SGD with momentum), batch 2-8 and image side 48-96 varying per step."""
    model = torchvision.models.resnet18(weights=None, num_classes=100)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    model.train()
    for _ in range(10):
        mark()
        batch, side = rng.choice([2, 4, 6, 8]), rng.choice([48, 64, 80, 96])
        x = torch.randn(batch, 3, side, side)
        y = torch.randint(0, 100, (batch,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, y, loss
    return model, opt


class TextClassifier(nn.Module):
    def __init__(self, vocab=8000, d=128, heads=4, layers=3, classes=10, max_len=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens, pad_mask):
        pos = torch.arange(tokens.shape[1]).unsqueeze(0)
        h = self.encoder(self.embed(tokens) + self.pos(pos), src_key_padding_mask=pad_mask)
        return self.head(h.mean(dim=1))


def transformer_train(mark, rng):
    """A 3-layer transformer encoder classifier (AdamW), sequence length 16-160 varying per step."""
    model = TextClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model.train()
    for _ in range(12):
        mark()
        batch, seq = 8, rng.choice([16, 24, 32, 48, 64, 96, 128, 160])
        tokens = torch.randint(0, 8000, (batch, seq))
        lengths = torch.randint(seq // 2, seq + 1, (batch,))
        pad_mask = torch.arange(seq).unsqueeze(0) >= lengths.unsqueeze(1)
        loss = F.cross_entropy(model(tokens, pad_mask), torch.randint(0, 10, (batch,)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        del tokens, lengths, pad_mask, loss
    return model, opt


class LanguageModel(nn.Module):
    # The size of the classic "medium" PTB language model (Zaremba et al. 2014).
    def __init__(self, vocab=10000, d=650, hidden=650, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, layers, batch_first=True, dropout=0.5)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        h, _ = self.lstm(self.embed(tokens))
        return self.out(h)


def lstm_train(mark, rng):
    """A 2-layer LSTM language model (SGD), batch 8-32 and BPTT length 20-40 varying per step."""
    model = LanguageModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    for _ in range(10):
        mark()
        batch, seq = rng.choice([8, 16, 20, 32]), rng.randint(20, 40)
        tokens = torch.randint(0, 10000, (batch, seq + 1))
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        del tokens, logits, loss
    return model, opt


def serving(mark, rng):
    """MobileNetV2 inference (no autograd), request batches of 1-16 images at 128x128."""
    model = torchvision.models.mobilenet_v2(weights=None)
    model.eval()
    with torch.inference_mode():
        for _ in range(20):
            mark()
            batch = rng.choice([1, 1, 2, 4, 8, 16])
            x = torch.randn(batch, 3, 128, 128)
            probs = torch.softmax(model(x), dim=1)
            top = probs.topk(5, dim=1)
            del x, probs, top
    return model, None


def segmentation_train(mark, rng):
    """LR-ASPP MobileNetV3 semantic segmentation training (SGD), batch 2-4, images 96-192 per side."""
    model = torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                                      num_classes=21)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    model.train()
    for _ in range(10):
        mark()
        batch = rng.choice([2, 3, 4])
        h, w = rng.choice([96, 128, 160, 192]), rng.choice([96, 128, 160, 192])
        x = torch.randn(batch, 3, h, w)
        target = torch.randint(0, 21, (batch, h, w))
        loss = F.cross_entropy(model(x)["out"], target, ignore_index=255)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, target, loss
    return model, opt


def detection_infer(mark, rng):
    """Faster R-CNN (MobileNetV3-FPN) inference on batches of 1-2 images of differing sizes and shapes."""
    # Fewer proposals than the default (150) keep the 1024-wide box head cheap on CPU.
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=91, min_size=256, max_size=416,
        rpn_pre_nms_top_n_test=300, rpn_post_nms_top_n_test=60, box_score_thresh=0.0)
    model.eval()
    with torch.inference_mode():
        for _ in range(8):
            mark()
            images = [torch.rand(3, rng.randint(160, 400), rng.randint(160, 400)) for _ in range(rng.randint(1, 2))]
            out = model(images)
            del images, out
    return model, None


def finetune_adam(mark, rng):
    """Fine-tuning a ViT-S/16 at 224x224 with Adam: the patch embedding and first half of the encoder
    frozen, optimizer state appearing at the first step; batch 4-16 varying per step."""
    model = torchvision.models.VisionTransformer(image_size=224, patch_size=16, num_layers=12, num_heads=6,
                                                 hidden_dim=384, mlp_dim=1536, num_classes=37)
    for p in model.conv_proj.parameters():
        p.requires_grad_(False)
    for block in list(model.encoder.layers)[:6]:
        for p in block.parameters():
            p.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    for _ in range(12):
        mark()
        batch = rng.choice([4, 8, 12, 16])
        x = torch.randn(batch, 3, 224, 224)
        loss = F.cross_entropy(model(x), torch.randint(0, 37, (batch,)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, loss
    return model, opt


MODELS = {
    "cnn_train": cnn_train,
    "transformer_train": transformer_train,
    "lstm_train": lstm_train,
    "serving": serving,
    "segmentation_train": segmentation_train,
    "detection_infer": detection_infer,
    "finetune_adam": finetune_adam,
}


def main():
    if len(sys.argv) != 2 or (sys.argv[1] not in MODELS and sys.argv[1] != "--list"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if sys.argv[1] == "--list":
        for name, fn in MODELS.items():
            print(f"{name}\t{' '.join(fn.__doc__.split())}")
        return 0
    torch.set_num_threads(1)  # the same allocation order on every machine
    torch.manual_seed(0)
    model, opt = MODELS[sys.argv[1]](_mark_fn(), random.Random(sys.argv[1]))
    del model, opt
    return 0


if __name__ == "__main__":
    sys.exit(main())
