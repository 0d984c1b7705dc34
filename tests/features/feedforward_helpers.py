"""Shared builders and independent references of the feed-forward kernel tests."""

import math

import torch

import kattn

H, D = 3, 16
NAMES = ["ffk_linear", "ffk_fcnn", "ffk_glu", "ffk_oglu", "ffk_aoglu", "ffk_ae", "ffk_vae"]
DEEP = {"ffk_fcnn", "ffk_glu", "ffk_oglu", "ffk_aoglu"}  # the maps with a depth option


def two_layers(name):
    """``depth=2`` where the map has layers, so hidden layers are exercised too."""
    return {"depth": 2} if name in DEEP else {}


def build_map(name, *, seed=0, **options):
    torch.manual_seed(seed)
    return kattn.features.build(name, head_dim=D, num_heads=H, **options).double()


def build_attention(name, *, seed=0, train=False, **options):
    torch.manual_seed(seed)
    attn = kattn.build("kernelized", feature_map=name, head_dim=D, num_heads=H, **options)
    return attn.double().train(train)


# ------------------------------------------------------------------ independent references
def project(x, w):
    return torch.einsum("bhld,hdm->bhlm", x, w.to(x.dtype))


def softplus(t):
    return torch.log1p(torch.exp(t))


def sigmoid(t):
    return 1.0 / (1.0 + torch.exp(-t))


def gelu(t):
    return 0.5 * t * (1.0 + torch.erf(t / math.sqrt(2.0)))


def reference_features(fm, name, x):
    """φ(x) written from the formulas of §4.1.1, reading only the map's parameters."""
    if name == "ffk_linear":
        return softplus(project(x, fm.weight))
    if name == "ffk_fcnn":
        for w in fm.hidden:
            x = gelu(project(x, w))
        return softplus(project(x, fm.weight))
    if name in ("ffk_glu", "ffk_oglu", "ffk_aoglu"):
        for i, layer in enumerate(fm.layers):
            w_g = layer.gate if layer.gate is not None else layer.gate_down @ layer.gate_up
            t = project(x, layer.transform)
            x = (softplus(t) if i == len(fm.layers) - 1 else t) * sigmoid(project(x, w_g))
        return x
    if name == "ffk_ae":
        return softplus(project(x, fm.encoder))
    if name == "ffk_vae":  # eval: z = μ
        return softplus(project(x, fm.mean))
    raise AssertionError(name)


def dense_attention(fq, fk, v, *, causal, key_padding_mask):
    a = torch.einsum("bhim,bhjm->bhij", fq, fk)
    if key_padding_mask is not None:
        a = a.masked_fill(key_padding_mask[:, None, None, :], 0.0)
    if causal:
        lq, lk = a.shape[-2:]
        a = a.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), 0.0)
    return (a @ v) / a.sum(-1, keepdim=True)
