"""Held-out Keras models for the hardware benchmarks (not in the zoo): graphs with real
parallelism, imported the way a user imports their own (``module:function``)::

    placetool import models:towers --batch 256 --out towers.npz      # from benchmarks/
"""

import keras


def towers(width=512, hidden=640, depth=3, n_towers=4, classes=10):
    """Four parallel towers of three Dense(640, relu) on a 512-wide input, concatenated
    into Dense(10): independent work a second device can take."""
    keras.utils.set_random_seed(0)
    x = keras.Input((width,), name="features")
    outs = []
    for t in range(n_towers):
        h = x
        for k in range(depth):
            h = keras.layers.Dense(hidden, activation="relu", name=f"tower{t}_dense{k}")(h)
        outs.append(h)
    h = keras.layers.Concatenate(name="join")(outs)
    return keras.Model(x, keras.layers.Dense(classes, name="logits")(h), name="towers")


def inception_block(size=28, channels=32, blocks=2, classes=10):
    """A small Inception-style network: ``blocks`` blocks of four parallel branches (1x1;
    1x1 -> 3x3; 1x1 -> 3x3 -> 3x3; 3x3 max-pool -> 1x1) concatenated, then pooling and
    a dense classifier."""
    keras.utils.set_random_seed(0)
    L = keras.layers
    x = keras.Input((size, size, 3), name="image")
    h = L.Conv2D(channels, 3, padding="same", activation="relu", name="stem")(x)
    for b in range(blocks):
        c = channels
        b1 = L.Conv2D(c, 1, activation="relu", name=f"b{b}_1x1")(h)
        b2 = L.Conv2D(c, 1, activation="relu", name=f"b{b}_3x3_reduce")(h)
        b2 = L.Conv2D(c, 3, padding="same", activation="relu", name=f"b{b}_3x3")(b2)
        b3 = L.Conv2D(c // 2, 1, activation="relu", name=f"b{b}_5x5_reduce")(h)
        b3 = L.Conv2D(c, 3, padding="same", activation="relu", name=f"b{b}_5x5_a")(b3)
        b3 = L.Conv2D(c, 3, padding="same", activation="relu", name=f"b{b}_5x5_b")(b3)
        b4 = L.MaxPooling2D(3, strides=1, padding="same", name=f"b{b}_pool")(h)
        b4 = L.Conv2D(c, 1, activation="relu", name=f"b{b}_pool_proj")(b4)
        h = L.Concatenate(name=f"b{b}_concat")([b1, b2, b3, b4])
    h = L.GlobalAveragePooling2D(name="avg_pool")(h)
    return keras.Model(x, L.Dense(classes, name="logits")(h), name="inception_block")
