"""Reinforcement-learning placers: REINFORCE with the compiled simulator as the reward.

Importing this package is light (no TensorFlow); TF loads when a policy is built.

- :mod:`placetool.rl.features`  numpy featurisation of colocation groups, coarsening to super-groups
- :mod:`placetool.rl.policies`  ``seq2seq`` (ColocRL) and ``hierarchical`` (grouper + placer) on
  coarsened groups, the papers' baselines; ``gdp`` (GraphSAGE over ops pooled per group) on every group
- :mod:`placetool.rl.trainer`   REINFORCE: K samples per step, EMA or leave-one-out baseline, PPO-style
  clipped passes, entropy schedule; a frozen-network path with closed-form steps on the residual table
- :mod:`placetool.rl.config`    the trainer's knobs, grouped (sampling, compound moves, update), read
  from the flat ``--option`` keys
- :mod:`placetool.rl.errors`    ``PolicyError``, raised by the policies and the numpy gdp network
- :mod:`placetool.rl.method`    ``placetool search --method rl`` (registered as "rl")
- :mod:`placetool.rl.env`       the placement problem as a ``gymnasium.Env``
"""
