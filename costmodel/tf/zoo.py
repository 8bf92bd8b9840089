"""The placement papers' benchmark models, built in Keras, and the bundled graph files.

Regenerate every bundled graph (``data/graphs/NAME.npz``, see :mod:`.regenerate`) with::

    python -m placetool.costmodel.tf.zoo --all            # or: python -m placetool.costmodel.tf.zoo NAME ...

Each builder returns a :class:`Built`: the Keras model, its loss, a map from Keras layers
to layer indices (``graph.layer``, used by the ``expert`` placement) and
``meta["expert"]``: ``"layers"`` (NMT/GNMT/Transformer: layer k on GPU k mod n_gpus,
attention and softmax tagged with the last layer) or ``"single-gpu"``. Sizes (hidden
units, sequence length, batch) are in :data:`ZOO` and ``data/graphs/README.md``.
LSTMs are unrolled (``unroll=True``) so the graph has no While loops.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Built:
    """A model ready to trace: Keras model, loss, layer tags, graph metadata."""

    model: object
    loss: object = None
    layer_of: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


@dataclass
class ZooSpec:
    build: Callable[..., Built]
    batch: int
    doc: str


def _keras():
    from .session import import_keras

    return import_keras()


def _sparse_ce():
    return _keras().losses.SparseCategoricalCrossentropy(from_logits=True)


# ---------------------------------------------------------------- CNNs
def _application(fn_name, size, **extra):
    def build(image_size=size, classes=1000):
        keras = _keras()
        keras.utils.set_random_seed(0)
        fn = getattr(keras.applications, fn_name)
        m = fn(weights=None, input_shape=(image_size, image_size, 3), classes=classes,
               classifier_activation=None, **extra)
        # top-level Keras layers in order: layer index = ordinal (for depth-based tools)
        tags = {l: i for i, l in enumerate(m.layers)}
        return Built(m, _sparse_ce(), tags, {"expert": "single-gpu", "image_size": image_size,
                                             "classes": classes})
    return build


# ---------------------------------------------------------------- recurrent
def build_rnnlm(layers=2, hidden=2048, vocab=40000, seq_len=20, embed=None):
    """2-layer LSTM language model (ColocRL's RNNLM), unrolled over ``seq_len`` steps."""
    keras = _keras()
    L = keras.layers
    keras.utils.set_random_seed(0)
    x = keras.Input((seq_len,), dtype="int32", name="tokens")
    emb = L.Embedding(vocab, embed or hidden, name="embedding")
    h = emb(x)
    tags = {emb: 0}
    for k in range(layers):
        lstm = L.LSTM(hidden, return_sequences=True, unroll=True, name=f"lstm_{k}")
        h = lstm(h)
        tags[lstm] = k
    out = L.Dense(vocab, name="softmax")
    y = out(h)
    tags[out] = layers - 1
    m = keras.Model(x, y, name="rnnlm")
    return Built(m, _sparse_ce(), tags, {"expert": "single-gpu", "layers": layers,
                                        "hidden": hidden, "vocab": vocab, "seq_len": seq_len})


def build_seq2seq(layers=2, hidden=1024, vocab=30000, src_len=30, tgt_len=30, gnmt=False,
                  name="nmt"):
    """Encoder-decoder LSTM with attention, unrolled.

    ``gnmt=False``: Luong-style NMT (attention over the top encoder layer from the top
    decoder layer). ``gnmt=True``: GNMT-style: bidirectional first encoder layer, residual
    connections from the third layer on, attention from the bottom decoder layer whose
    context feeds every upper decoder layer. Layer k of encoder and decoder is tagged k;
    attention and the softmax are tagged with the last layer (the papers' expert).
    """
    keras = _keras()
    L = keras.layers
    keras.utils.set_random_seed(0)
    last = layers - 1
    src = keras.Input((src_len,), dtype="int32", name="source")
    tgt = keras.Input((tgt_len,), dtype="int32", name="target_in")
    tags = {}

    def tag(layer, k):
        tags[layer] = k
        return layer

    e = tag(L.Embedding(vocab, hidden, name="enc_embedding"), 0)(src)
    d_in = tag(L.Embedding(vocab, hidden, name="dec_embedding"), 0)(tgt)
    states = []
    h = e
    for k in range(layers):
        if gnmt and k == 0:
            bi = tag(L.Bidirectional(L.LSTM(hidden // 2, return_sequences=True, unroll=True),
                                     name="enc_lstm_0"), 0)
            h = bi(h)
            states.append(None)
            continue
        lstm = tag(L.LSTM(hidden, return_sequences=True, return_state=True, unroll=True,
                          name=f"enc_lstm_{k}"), k)
        out, sh, sc = lstm(h)
        h = tag(L.Add(name=f"enc_residual_{k}"), k)([h, out]) if gnmt and k >= 2 else out
        states.append([sh, sc])
    enc_out = h
    d = d_in
    context = None
    for k in range(layers):
        lstm = tag(L.LSTM(hidden, return_sequences=True, unroll=True, name=f"dec_lstm_{k}"), k)
        init = states[k] if states[k] is not None else None
        inp = d
        if gnmt and context is not None:
            inp = tag(L.Concatenate(name=f"dec_feed_{k}"), k)([d, context])
        out = lstm(inp, initial_state=init) if init is not None else lstm(inp)
        d = tag(L.Add(name=f"dec_residual_{k}"), k)([d, out]) if gnmt and k >= 2 else out
        if gnmt and k == 0:
            context = tag(L.Attention(name="attention"), last)([d, enc_out])
    if not gnmt:
        context = tag(L.Attention(name="attention"), last)([d, enc_out])
    feat = tag(L.Concatenate(name="attention_concat"), last)([d, context])
    feat = tag(L.Dense(hidden, activation="tanh", name="attention_proj"), last)(feat)
    logits = tag(L.Dense(vocab, name="softmax"), last)(feat)
    m = keras.Model([src, tgt], logits, name=name)
    return Built(m, _sparse_ce(), tags, {"expert": "layers", "layers": layers, "hidden": hidden,
                                        "vocab": vocab, "src_len": src_len, "tgt_len": tgt_len})


# ---------------------------------------------------------------- transformer, wavenet
def build_transformer(layers=6, d_model=512, heads=8, d_ff=2048, vocab=32000, seq_len=64):
    """Transformer (base) encoder-decoder; layer k of encoder and decoder tagged k."""
    # starts as build_nmt does (seeded Keras, source and target inputs, a tag per layer):
    # a few lines kept in each builder so that each reads as one model, whole
    keras = _keras()
    L = keras.layers
    keras.utils.set_random_seed(0)
    src = keras.Input((seq_len,), dtype="int32", name="source")
    tgt = keras.Input((seq_len,), dtype="int32", name="target_in")
    tags = {}

    def tag(layer, k):
        tags[layer] = k
        return layer

    def block(x, k, kind, memory=None):
        a = tag(L.MultiHeadAttention(heads, d_model // heads, name=f"{kind}_self_attn_{k}"), k)
        x = tag(L.LayerNormalization(name=f"{kind}_ln1_{k}"), k)(
            x + a(x, x, use_causal_mask=(kind == "dec")))
        if memory is not None:
            c = tag(L.MultiHeadAttention(heads, d_model // heads, name=f"{kind}_cross_attn_{k}"), k)
            x = tag(L.LayerNormalization(name=f"{kind}_ln2_{k}"), k)(x + c(x, memory))
        f1 = tag(L.Dense(d_ff, activation="relu", name=f"{kind}_ff1_{k}"), k)
        f2 = tag(L.Dense(d_model, name=f"{kind}_ff2_{k}"), k)
        return tag(L.LayerNormalization(name=f"{kind}_ln3_{k}"), k)(x + f2(f1(x)))

    e = tag(L.Embedding(vocab, d_model, name="enc_embedding"), 0)(src)
    d = tag(L.Embedding(vocab, d_model, name="dec_embedding"), 0)(tgt)
    for k in range(layers):
        e = block(e, k, "enc")
    for k in range(layers):
        d = block(d, k, "dec", memory=e)
    logits = tag(L.Dense(vocab, name="softmax"), layers - 1)(d)
    m = keras.Model([src, tgt], logits, name="transformer")
    return Built(m, _sparse_ce(), tags, {"expert": "layers", "layers": layers, "d_model": d_model,
                                        "heads": heads, "d_ff": d_ff, "vocab": vocab,
                                        "seq_len": seq_len})


def build_wavenet(stacks=2, layers_per_stack=10, residual=64, skip=256, classes=256,
                  length=4096):
    """WaveNet: stacks of gated dilated causal convolutions (dilation 1..512) with skips."""
    keras = _keras()
    L = keras.layers
    keras.utils.set_random_seed(0)
    x = keras.Input((length, 1), name="audio")
    tags = {}

    def tag(layer, k):
        tags[layer] = k
        return layer

    h = tag(L.Conv1D(residual, 2, padding="causal", name="input_conv"), 0)(x)
    skips = []
    k = 0
    for s in range(stacks):
        for i in range(layers_per_stack):
            dil = 2 ** i
            f = tag(L.Conv1D(residual, 2, dilation_rate=dil, padding="causal",
                             activation="tanh", name=f"filter_{k}"), k)(h)
            g = tag(L.Conv1D(residual, 2, dilation_rate=dil, padding="causal",
                             activation="sigmoid", name=f"gate_{k}"), k)(h)
            z = tag(L.Multiply(name=f"gated_{k}"), k)([f, g])
            skips.append(tag(L.Conv1D(skip, 1, name=f"skip_{k}"), k)(z))
            h = tag(L.Add(name=f"residual_{k}"), k)([h, tag(L.Conv1D(residual, 1, name=f"res_{k}"), k)(z)])
            k += 1
    out = tag(L.Add(name="skip_sum"), k - 1)(skips)
    out = tag(L.Activation("relu", name="post_relu"), k - 1)(out)
    out = tag(L.Conv1D(skip, 1, activation="relu", name="post_conv"), k - 1)(out)
    logits = tag(L.Conv1D(classes, 1, name="logits"), k - 1)(out)
    m = keras.Model(x, logits, name="wavenet")
    return Built(m, _sparse_ce(), tags, {"expert": "single-gpu", "stacks": stacks,
                                        "layers_per_stack": layers_per_stack,
                                        "residual": residual, "skip": skip, "length": length})


def build_mlp(hidden=64, depth=2, features=32, classes=10):
    """A small MLP (tests and smoke runs)."""
    keras = _keras()
    L = keras.layers
    keras.utils.set_random_seed(0)
    x = keras.Input((features,), name="features")
    tags, h = {}, x
    for k in range(depth):
        d = L.Dense(hidden, activation="relu", name=f"dense_{k}")
        tags[d] = k
        h = d(h)
    out = L.Dense(classes, name="logits")
    tags[out] = depth - 1
    m = keras.Model(x, out(h), name="mlp")
    return Built(m, _sparse_ce(), tags, {"expert": "single-gpu"})


def _seq2seq(layers, gnmt, name, **defaults):
    def build(**kw):
        args = dict(defaults)
        args.update(kw)
        return build_seq2seq(layers=layers, gnmt=gnmt, name=name, **args)
    return build


#: name -> builder, default batch, sizes (the order is smallest-first, for --all).
ZOO: dict[str, ZooSpec] = {
    "mlp": ZooSpec(build_mlp, 16, "2-layer MLP, 64 hidden (tests)"),
    "rnnlm": ZooSpec(build_rnnlm, 64, "2-layer LSTM LM, 2048 hidden, vocab 40k, 20 steps, batch 64"),
    "nmt": ZooSpec(_seq2seq(2, False, "nmt", hidden=1024, vocab=30000, src_len=30, tgt_len=30), 64,
                   "2-layer enc-dec LSTM + attention, 1024 hidden, vocab 30k, 30+30 steps, batch 64"),
    "wavenet": ZooSpec(build_wavenet, 4, "2 stacks x 10 dilated layers, 64 residual / 256 skip, 4096 samples, batch 4"),
    "transformer": ZooSpec(build_transformer, 32, "Transformer base: 6+6 layers, d 512, 8 heads, ff 2048, 64 tokens, batch 32"),
    "resnet50": ZooSpec(_application("ResNet50", 224), 32, "ResNet-50, 224x224, batch 32"),
    "inception_v3": ZooSpec(_application("InceptionV3", 299), 32, "Inception-V3, 299x299, batch 32"),
    "nasnet_mobile": ZooSpec(_application("NASNetMobile", 224), 32, "NASNet-A Mobile, 224x224, batch 32"),
    # training graphs of the dispatching rule (data/policies/dispatch): branchy and
    # depthwise convolution networks beside the one residual stack above
    "densenet121": ZooSpec(_application("DenseNet121", 224), 32, "DenseNet-121, 224x224, batch 32"),
    "mobilenet_v2": ZooSpec(_application("MobileNetV2", 224), 32, "MobileNet-V2, 224x224, batch 32"),
    "xception": ZooSpec(_application("Xception", 299), 32, "Xception, 299x299, batch 32"),
    "gnmt4": ZooSpec(_seq2seq(4, True, "gnmt4", hidden=1024, vocab=32000, src_len=40, tgt_len=40), 64,
                     "4-layer GNMT, 1024 hidden, vocab 32k, 40+40 steps, batch 64"),
    "gnmt8": ZooSpec(_seq2seq(8, True, "gnmt8", hidden=1024, vocab=32000, src_len=80, tgt_len=80), 64,
                     "8-layer GNMT, 1024 hidden, vocab 32k, 80+80 steps, batch 64"),
}

#: Graphs bundled in data/graphs/ (mlp is for tests only).
BUNDLED = [n for n in ZOO if n != "mlp"]


if __name__ == "__main__":
    # the regeneration script imports the importer, which imports this module: keep the
    # library's imports one-way (importer -> zoo) and run the script from its own module
    from placetool.costmodel.tf.regenerate import main

    sys.exit(main())
